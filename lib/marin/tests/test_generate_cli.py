"""``marin generate``: a model found from its hf/ folder, its step's output folder or its step name."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import pytest

from levanter.compat.hf_checkpoints import export_llama_to_hf
from levanter.inference import SamplingConfig
from levanter.models.llama import LlamaConfig, LlamaLMHeadModel
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from marin import cli
from marin.execution.step_runner import StepRunFailed, StepRunner
from marin.execution.step_spec import StepSpec
from marin.generate import ModelNotFoundError, generate, locate_model

TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=64)
STEP = "checkpoints/tiny-generator"
PROMPT = "Once upon a time"
# Every test decodes with the same settings, so the sampling loop compiles once per prompt length.
GREEDY = ["--max-new-tokens", "4", "--temperature", "0", "--top-k", "0", "--top-p", "1"]
GREEDY_CONFIG = SamplingConfig(max_new_tokens=4, temperature=0.0, top_k=None, top_p=None)


def _export_random_model(output_path: str, tokenizer_folder: str) -> dict:
    """A train step's output layout in miniature: the HF export (with its tokenizer) in hf/."""
    model = LlamaLMHeadModel(TINY, 300, key=jax.random.PRNGKey(0))
    hf_path = export_llama_to_hf(model, os.path.join(output_path, "hf"), tokenizer_dir_or_obj=tokenizer_folder)
    return {"hf_path": hf_path}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, synthetic_stories):
    root = tmp_path_factory.mktemp("generate")
    tokenizer_folder = save_tokenizer(train_bpe_tokenizer(synthetic_stories[:100], 300), str(root / "tokenizer"))
    prefix = str(root / "prefix")
    step = StepSpec(name=STEP, fn=lambda output_path: _export_random_model(output_path, tokenizer_folder), deps=[], hash_attrs={"seed": 0})
    report = StepRunner(prefix=prefix).run([step])
    return prefix, report.outcome_of(STEP).output_path


def _marin(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(["generate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_generate_from_the_hf_folder_prints_prompt_and_continuation(trained, capsys):
    _, output = trained
    code, out, err = _marin(capsys, os.path.join(output, "hf"), "--prompt", PROMPT, *GREEDY)
    assert code == 0, err
    assert out.startswith(PROMPT) and len(out.strip()) > len(PROMPT)
    assert out.strip() == generate(output, [PROMPT], GREEDY_CONFIG)[0]


def test_step_folder_and_step_name_resolve_to_the_same_export(trained):
    prefix, output = trained
    assert locate_model(output).hf_path == os.path.join(output, "hf")
    by_name = locate_model(STEP, prefix=prefix)
    assert by_name.hf_path == os.path.join(output, "hf") and by_name.step_output == output


def test_step_name_on_the_command_line_with_several_prompts(trained, capsys):
    prefix, _ = trained
    code, out, err = _marin(capsys, STEP, "--prefix", prefix, "--prompt", PROMPT, "--prompt", "One day", *GREEDY)
    assert code == 0, err
    first, second = out.strip().split("\n\n")
    assert first.startswith(PROMPT) and second.startswith("One day")


def test_options_become_the_sampling_config():
    from argparse import Namespace

    from marin.generate import sampling_from_args

    chosen = sampling_from_args(Namespace(max_new_tokens=9, temperature=0.5, top_k=5, top_p=0.9, seed=4))
    assert chosen == SamplingConfig(max_new_tokens=9, temperature=0.5, top_k=5, top_p=0.9, seed=4)
    off = sampling_from_args(Namespace(max_new_tokens=None, temperature=None, top_k=0, top_p=1.0, seed=None))
    assert off == SamplingConfig(top_k=None, top_p=None)
    assert sampling_from_args(Namespace()) == SamplingConfig()


def test_same_seed_same_text_and_greedy_is_deterministic(trained):
    _, output = trained
    sampled = SamplingConfig(max_new_tokens=4, temperature=1.0, top_k=None, top_p=None, seed=3)
    assert generate(output, [PROMPT], sampled) == generate(output, [PROMPT], sampled)
    reseeded = SamplingConfig(max_new_tokens=4, temperature=0.0, top_k=None, top_p=None, seed=9)
    assert generate(output, [PROMPT], GREEDY_CONFIG) == generate(output, [PROMPT], reseeded)


def test_folder_without_a_model_says_what_to_pass(tmp_path, capsys):
    code, out, err = _marin(capsys, str(tmp_path), "--prompt", "hi")
    assert code == 2 and out == ""
    assert f"{tmp_path} holds no model" in err and "hf/" in err and "marin status" in err


def test_unknown_step_name_names_the_prefix_and_marin_status(tmp_path, capsys):
    code, _, err = _marin(capsys, "checkpoints/no-such-model", "--prefix", str(tmp_path), "--prompt", "hi")
    assert code == 2
    assert "'checkpoints/no-such-model' is neither a folder nor a step under the prefix" in err
    assert str(tmp_path) in err and "marin status" in err


def test_a_failed_training_step_is_reported_as_such(tmp_path):
    def broken(output_path):
        raise RuntimeError("out of memory")

    runner = StepRunner(prefix=str(tmp_path))
    with pytest.raises(StepRunFailed):
        runner.run([StepSpec(name="checkpoints/broken", fn=broken, deps=[])])
    with pytest.raises(ModelNotFoundError, match=r"its step is FAILED \(RuntimeError: out of memory\)\. Run the training step"):
        locate_model("checkpoints/broken", prefix=str(tmp_path))


def test_step_name_skips_a_newer_run_that_failed(trained):
    prefix, output = trained

    def crashed(output_path):
        raise RuntimeError("preempted")

    newer = StepSpec(name=STEP, fn=crashed, deps=[], hash_attrs={"seed": 1})
    assert StepRunner(prefix=prefix).run([newer], raise_on_failure=False).failed == [STEP]
    assert locate_model(STEP, prefix=prefix).step_output == output


def test_missing_tokenizer_beside_the_model_points_at_tokenizer_option(trained, tmp_path):
    _, output = trained
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((Path(output) / "hf" / name).read_bytes())
    with pytest.raises(ModelNotFoundError, match="Pass --tokenizer"):
        generate(str(bare), [PROMPT], GREEDY_CONFIG)
    texts = generate(str(bare), [PROMPT], GREEDY_CONFIG, tokenizer=os.path.join(output, "hf"))
    assert texts == generate(output, [PROMPT], GREEDY_CONFIG)


@pytest.mark.parametrize(
    "option, message",
    [
        (["--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--temperature", "-1"], "--temperature must be 0 (greedy) or more"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    ],
)
def test_impossible_sampling_options_are_refused_before_loading(tmp_path, capsys, option, message):
    code, _, err = _marin(capsys, str(tmp_path / "never-read"), "--prompt", "hi", *option)
    assert code == 2 and message in err


def test_help_states_the_sampling_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    defaults = SamplingConfig()
    for expected in (
        f"(default {defaults.max_new_tokens})",
        f"greedy (default {defaults.temperature})",
        f"off (default {defaults.top_k})",
        f"off (default {defaults.top_p})",
        f"(default {defaults.seed})",
    ):
        assert expected in text


def test_a_url_with_nothing_there_says_so():
    with pytest.raises(ModelNotFoundError, match="memory://generate-test-empty/checkpoints/tiny-0123abcd does not exist"):
        locate_model("memory://generate-test-empty/checkpoints/tiny-0123abcd")


def test_a_tokenizer_larger_than_the_model_is_refused(trained, capsys, tmp_path, synthetic_stories):
    _, output = trained
    larger = save_tokenizer(train_bpe_tokenizer(synthetic_stories[:100], 1200), str(tmp_path / "larger"))
    code, _, err = _marin(capsys, output, "--prompt", PROMPT, "--tokenizer", larger, *GREEDY)
    assert code == 2
    assert "has 1,200 tokens but the model only 300: it is not the tokenizer this model was trained with" in err


def test_chat_renders_the_users_message_and_prints_the_reply_alone(trained, capsys):
    from levanter.compat.hf_checkpoints import import_from_hf
    from levanter.inference import generate_text
    from levanter.tokenization import load_tokenizer
    from levanter.tokenization.chat import ChatRenderer, resolve_chat_template

    _, output = trained
    code, out, err = _marin(capsys, output, "--chat", "--prompt", "Who found the ball?", *GREEDY)
    assert code == 0, err
    # The same as rendering the message by hand (the tokenizer has no template: ChatML) with the
    # assistant's turn opened, no BOS before it, and keeping only what the model wrote.
    tokenizer = load_tokenizer(os.path.join(output, "hf"))
    renderer = ChatRenderer.for_tokenizer(tokenizer, resolve_chat_template(tokenizer))
    prompt = renderer.render([{"role": "user", "content": "Who found the ball?"}], add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>user\nWho found the ball?<|im_end|>\n<|im_start|>assistant\n")
    model_dir = os.path.join(output, "hf")
    by_hand = generate_text(import_from_hf(model_dir), tokenizer, [prompt], GREEDY_CONFIG, add_bos=False,
                            stop_text="<|im_end|>", include_prompt=False)[0]
    assert out.rstrip("\n") == by_hand and "<|im_start|>" not in out


def test_a_reply_ends_at_the_templates_end_of_turn():
    from levanter.tokenization.chat import ChatRenderer, ChatTemplate, NAMED_TEMPLATES, reply_end_marker

    assert reply_end_marker(ChatRenderer(ChatTemplate("chatml", NAMED_TEMPLATES["chatml"]))) == "<|im_end|>"
    header_style = (
        "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
        "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    )
    assert reply_end_marker(ChatRenderer(ChatTemplate("custom", header_style))) == "<|eot_id|>"


def test_generation_stops_at_a_stop_text_and_can_leave_the_prompt_out(trained):
    from levanter.compat.hf_checkpoints import import_from_hf
    from levanter.inference import generate_text
    from levanter.tokenization import load_tokenizer

    _, output = trained
    model_dir = os.path.join(output, "hf")
    model, tokenizer = import_from_hf(model_dir), load_tokenizer(model_dir)
    config = SamplingConfig(max_new_tokens=12, temperature=0.0, top_k=None, top_p=None)
    full = generate_text(model, tokenizer, [PROMPT], config, include_prompt=False)[0]
    assert full and not full.startswith(PROMPT)
    stop = full.strip().split()[1] if len(full.split()) > 1 else full.strip()[:2]
    cut = generate_text(model, tokenizer, [PROMPT], config, stop_text=stop, include_prompt=False)[0]
    assert cut == full[: full.index(stop)]


def test_sampled_byte_tokens_print_readably_and_are_explained(monkeypatch, capsys):
    import marin.generate as generating

    # What an untrained byte-level model samples: a bell, an escape sequence and bytes that are no UTF-8 text.
    monkeypatch.setattr(generating, "generate", lambda *args, **kwargs: ["Once upon\x07\x1b[2J a\ufffd\ufffd time\n\tend"])
    assert cli.main(["generate", "anything", "--prompt", "Once upon"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "Once upon\\x07\\x1b[2J a\ufffd\ufffd time\n\tend\n"  # newlines and tabs stay themselves
    assert captured.err.startswith("marin generate: \\xNN marks a control byte and \ufffd bytes that are not UTF-8 text")

    monkeypatch.setattr(generating, "generate", lambda *args, **kwargs: ["Once upon a time, a fox."])
    assert cli.main(["generate", "anything", "--prompt", "Once upon"]) == 0
    assert capsys.readouterr().err == ""  # plain text: nothing to explain
