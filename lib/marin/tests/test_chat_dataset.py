"""Chat datasets and supervised fine-tuning: conversations rendered with chat templates, a loss mask
exactly on the assistant's tokens, a training loss that counts only those, and a model that learns."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from levanter.data import TokenWindows
from levanter.data.batch import Batch
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.tokenization import (
    ChatRenderer,
    ChatTemplate,
    ChatTemplateError,
    encode_conversations,
    load_tokenizer,
    resolve_chat_template,
    save_tokenizer,
    train_bpe_tokenizer,
)
from levanter.tokenization.chat import CHATML
from levanter.trainer import TrainState
from levanter.trainer.data_feed import to_device
from levanter.trainer.step import build_step_functions
from levanter.trainer.tracker import read_metrics
from marin.datasets.sources import SourceUnavailableError
from marin.execution.artifact import load_artifact
from marin.execution.records.run_report import StepRunFailed
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.experiment.sft import chat_dataset, sft
from marin.experiment.train import TrainConfigError, TrainedModel
from marin.processing.tokenize import TokenizedDataset
from zephyr.token_cache import TokenCache

# A Llama-3-style template: role headers between special tokens, each turn ended by <|eot_id|>.
HEADER_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"]
WORDS = ["system", "user", "assistant", "Be", "brief", "Hi", "Hello", "there", "How", "are", "you", "Fine", "thanks", "Bye"]


def _word_tokenizer() -> Tokenizer:
    """Whole words, each space, newline and punctuation mark a token of its own: every id is predictable by hand."""
    vocab = {token: i for i, token in enumerate(["[UNK]", " ", "\n", ".", "?", "!", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s|\w+|[^\w\s]"), behavior="isolated")
    tok.add_special_tokens(SPECIALS)
    return tok


def _save(tok: Tokenizer, folder: Path, template: str | None, **specials) -> Path:
    save_tokenizer(tok, str(folder), **specials)
    if template is not None:
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["chat_template"] = template
        config_path.write_text(json.dumps(config))
    return folder


def _write_jsonl(path: Path, conversations) -> Path:
    data = "".join(json.dumps({"messages": messages}) + "\n" for messages in conversations).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def _run(handle, prefix: Path) -> TokenizedDataset:
    runner = StepRunner(prefix=str(prefix))
    runner.run([handle])
    return load_artifact(runner.output_path_for(handle), TokenizedDataset).result


def _tokens_and_mask(cache: TokenCache, index: int, tok: Tokenizer) -> list[tuple[str, int]]:
    return [(tok.id_to_token(int(i)), int(m)) for i, m in zip(cache.document(index), cache.document_loss_mask(index))]


SYSTEM_USER_ASSISTANT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there!"},
    {"role": "assistant", "content": "Hello there."},
]
MULTI_TURN = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "How are you?"},
    {"role": "assistant", "content": "Fine thanks"},
]


@pytest.fixture(scope="module")
def word_tokenizers(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    tok = _word_tokenizer()
    return {
        "header": _save(tok, root / "header", HEADER_TEMPLATE, eos_token="<|eot_id|>", bos_token="<|begin_of_text|>"),
        "none": _save(tok, root / "none", None, eos_token="<|im_end|>"),
    }


# -- the mask, token by token -------------------------------------------------------------------------


def test_mask_is_one_exactly_on_the_assistant_tokens_of_the_tokenizers_template(word_tokenizers, tmp_path):
    source = _write_jsonl(tmp_path / "chats.jsonl", [SYSTEM_USER_ASSISTANT])
    handle = chat_dataset("chat/header", source=str(source), tokenizer=str(word_tokenizers["header"]))
    assert handle.hash_attrs["chat"].template["name"] == "tokenizer"
    result = _run(handle, tmp_path / "prefix")
    cache = TokenCache.open(result.cache_path("train"))
    assert cache.has_loss_mask and cache.metadata["chat_template"]["name"] == "tokenizer"
    header = lambda role: [("<|start_header_id|>", 0), (role, 0), ("<|end_header_id|>", 0), ("\n", 0), ("\n", 0)]
    expected = (
        [("<|begin_of_text|>", 0)]
        + header("system") + [("Be", 0), (" ", 0), ("brief", 0), (".", 0), ("<|eot_id|>", 0)]
        + header("user") + [("Hi", 0), (" ", 0), ("there", 0), ("!", 0), ("<|eot_id|>", 0)]
        # The reply and its end marker are trained on; its role header is not.
        + header("assistant") + [("Hello", 1), (" ", 1), ("there", 1), (".", 1), ("<|eot_id|>", 1)]
    )
    assert _tokens_and_mask(cache, 0, _word_tokenizer()) == expected
    assert result.eos_id is None and result.splits["train"].tokens == len(expected)


def test_a_tokenizer_without_a_template_uses_the_named_default_chatml(word_tokenizers, tmp_path):
    source = _write_jsonl(tmp_path / "chats.jsonl", [SYSTEM_USER_ASSISTANT])
    handle = chat_dataset("chat/default", source=str(source), tokenizer=str(word_tokenizers["none"]))
    chatml = ChatTemplate("chatml", CHATML)
    assert handle.hash_attrs["chat"].template == chatml.identity()  # stated in the config, so in the hash
    cache = TokenCache.open(_run(handle, tmp_path / "prefix").cache_path("train"))
    assert cache.metadata["chat_template"] == chatml.identity()
    turn = lambda role, words, trained: (
        [("<|im_start|>", 0), (role, 0), ("\n", 0)] + [(w, trained) for w in words] + [("<|im_end|>", trained), ("\n", 0)]
    )
    expected = (
        turn("system", ["Be", " ", "brief", "."], 0)
        + turn("user", ["Hi", " ", "there", "!"], 0)
        + turn("assistant", ["Hello", " ", "there", "."], 1)  # the newline after <|im_end|> separates turns
    )
    assert _tokens_and_mask(cache, 0, _word_tokenizer()) == expected
    # Naming the template explicitly is the same template, so the same step; another template is another step.
    same = chat_dataset("chat/default", source=str(source), tokenizer=str(word_tokenizers["none"]), template="chatml")
    other = chat_dataset("chat/default", source=str(source), tokenizer=str(word_tokenizers["none"]), template=HEADER_TEMPLATE)
    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    assert runner.output_path_for(same) == runner.output_path_for(handle) != runner.output_path_for(other)


def test_every_assistant_turn_of_a_multi_turn_conversation_is_trained_on(word_tokenizers, tmp_path):
    # The same conversations from jsonl.gz and from Parquet give the same tokens and masks.
    gz = _write_jsonl(tmp_path / "chats.jsonl.gz", [MULTI_TURN, SYSTEM_USER_ASSISTANT])
    pq.write_table(pa.table({"messages": [MULTI_TURN, SYSTEM_USER_ASSISTANT]}), tmp_path / "chats.parquet")
    caches = []
    for name, path in (("gz", gz), ("parquet", tmp_path / "chats.parquet")):
        handle = chat_dataset(f"chat/{name}", source=str(path), tokenizer=str(word_tokenizers["header"]))
        caches.append(TokenCache.open(_run(handle, tmp_path / "prefix").cache_path("train")))
    tok = _word_tokenizer()
    trained = [token for token, mask in _tokens_and_mask(caches[0], 0, tok) if mask]
    assert trained == ["Hello", "<|eot_id|>", "Fine", " ", "thanks", "<|eot_id|>"]
    for cache in caches[1:]:
        np.testing.assert_array_equal(cache.read_tokens(0, cache.num_tokens), caches[0].read_tokens(0, caches[0].num_tokens))
        np.testing.assert_array_equal(cache.read_loss_mask(0, cache.num_tokens), caches[0].read_loss_mask(0, caches[0].num_tokens))


def test_generation_marks_give_the_mask_transformers_gives(word_tokenizers):
    # An independent reference: transformers' assistant-token mask for a template with {% generation %}
    # blocks. Our prefix renders of the unmarked template must find the same tokens.
    transformers = pytest.importorskip("transformers")
    marked = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
        "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}"
        "{% else %}{{ m['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    folder = word_tokenizers["none"]
    tok = load_tokenizer(str(folder))
    reference = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    for messages in (MULTI_TURN, SYSTEM_USER_ASSISTANT):
        out = reference.apply_chat_template(messages, chat_template=marked, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        for template in (ChatTemplate("custom", marked), resolve_chat_template(tok)):
            ((ids, mask),) = encode_conversations(tok, ChatRenderer.for_tokenizer(tok, template), [messages], ["chat"])
            assert ids.tolist() == list(out["input_ids"])
            assert mask.tolist() == list(out["assistant_masks"])


def test_gpt2_without_a_template_or_chat_tokens_masks_the_replies(real_data):
    # GPT-2 has neither a chat template nor ChatML's markers as tokens: the markers are spelt out in
    # ordinary tokens, and the trained tokens still decode to exactly the replies with their end markers.
    tok = load_tokenizer(str(real_data.gpt2))
    template = resolve_chat_template(tok)
    assert tok.chat_template is None and template.name == "chatml"
    messages = MULTI_TURN[:1] + [{"role": "assistant", "content": " It is 4.\n"}] + MULTI_TURN[2:]
    ((ids, mask),) = encode_conversations(tok, ChatRenderer.for_tokenizer(tok, template), [messages], ["chat"])
    assert ids.tolist() == tok.tokenizer.encode(ChatRenderer(template).render(messages), add_special_tokens=False).ids
    trained = tok.tokenizer.decode([int(i) for i, m in zip(ids, mask) if m])
    assert trained == " It is 4.\n<|im_end|>Fine thanks<|im_end|>"


def test_a_tokenizer_folder_brings_its_chat_template(tmp_path):
    tok = _word_tokenizer()
    listed = _save(tok, tmp_path / "listed", [{"name": "tool_use", "template": "{{ 'tools' }}"},
                                               {"name": "default", "template": HEADER_TEMPLATE}])
    assert load_tokenizer(str(listed)).chat_template == HEADER_TEMPLATE
    own_file = _save(tok, tmp_path / "file", HEADER_TEMPLATE)
    (own_file / "chat_template.jinja").write_text(CHATML)  # the newer layout: a file of its own, which wins
    assert load_tokenizer(str(own_file / "tokenizer.json")).chat_template == CHATML
    assert resolve_chat_template(load_tokenizer(str(own_file))).identity() == {"name": "tokenizer",
                                                                               "digest": ChatTemplate("x", CHATML).digest}


# -- refusals ----------------------------------------------------------------------------------------


def test_a_token_straddling_a_reply_edge_is_refused_naming_the_record(word_tokenizers, tmp_path):
    # Role and reply run together ("assistantHello" is one word): no token boundary where the reply starts.
    glued = "{% for m in messages %}{{ m['role'] + m['content'] }}{% endfor %}{% if add_generation_prompt %}assistant{% endif %}"
    source = _write_jsonl(tmp_path / "chats.jsonl", [SYSTEM_USER_ASSISTANT, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]])
    handle = chat_dataset("chat/glued", source=str(source), tokenizer=str(word_tokenizers["header"]), template=glued)
    with pytest.raises(StepRunFailed, match=r"SegmentationMismatchError: .*chats.jsonl, line 1: tokenizing the conversation piece"):
        StepRunner(prefix=str(tmp_path / "prefix")).run([handle])


def test_a_template_that_rewrites_earlier_turns_is_refused(word_tokenizers):
    rewrites = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}[earlier]"
        "{% else %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    tok = load_tokenizer(str(word_tokenizers["header"]))
    renderer = ChatRenderer.for_tokenizer(tok, ChatTemplate("custom", rewrites))
    with pytest.raises(ChatTemplateError, match="chats.jsonl, line 9: .*renders turn 1 differently once later turns follow"):
        encode_conversations(tok, renderer, [MULTI_TURN], ["chats.jsonl, line 9"])
    with pytest.raises(ChatTemplateError, match="unknown chat template 'llama9'"):
        resolve_chat_template(tok, "llama9")


@pytest.mark.parametrize(
    "messages, message",
    [
        ([{"role": "user", "content": "Hi"}], "the conversation has no assistant turn"),
        ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}], "message 1 .assistant. has 'content' None"),
        ("Hi", "'messages' must be a non-empty list"),
    ],
)
def test_a_record_that_is_not_a_conversation_is_refused_naming_it(word_tokenizers, tmp_path, messages, message):
    source = tmp_path / "chats.jsonl"
    source.write_text(json.dumps({"messages": SYSTEM_USER_ASSISTANT}) + "\n" + json.dumps({"messages": messages}) + "\n")
    handle = chat_dataset("chat/bad", source=str(source), tokenizer=str(word_tokenizers["header"]))
    with pytest.raises(StepRunFailed, match=f"ConversationFormatError: .*chats.jsonl, line 2: {message}"):
        StepRunner(prefix=str(tmp_path / "prefix")).run([handle])


def test_a_hub_chat_dataset_offline_and_uncached_is_refused_when_declared(word_tokenizers):
    with pytest.raises(SourceUnavailableError, match="no-such-org/no-such-chats"):
        chat_dataset("chat/hub", source="no-such-org/no-such-chats", tokenizer=str(word_tokenizers["header"]))


def test_sft_refuses_a_plain_tokenized_dataset(word_tokenizers, tmp_path):
    text = tmp_path / "text.jsonl"
    text.write_text(json.dumps({"text": "Hello there"}) + "\n")
    plain = tokenized("tokenized/text", str(text), str(word_tokenizers["header"]))
    with pytest.raises(TrainConfigError, match="tokenized/text is not"):
        sft("checkpoints/sft", model=TINY, datasets={plain: 1.0}, batch_size=2, seq_len=16, num_train_steps=1)


# -- the training loss counts the assistant's tokens only ---------------------------------------------

TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=128)


@pytest.fixture(scope="module")
def sgd_step():
    """One SGD step (lr 1) of the real train step: new params = params - gradient, exactly."""
    vocab = _word_tokenizer().get_vocab_size()
    params, static = eqx.partition(TINY.build(vocab, key=jax.random.PRNGKey(0)), eqx.is_inexact_array)
    sgd = optax.sgd(1.0)
    step = build_step_functions(static_model=static, optimizer=sgd, lr_schedule=lambda s: 1.0, compute_dtype=jnp.float32,
                                z_loss_weight=0.0, num_microbatches=1, fused_loss=False).train_step

    def run(batch: Batch):
        state = TrainState(step=jnp.int32(0), params=jax.tree.map(jnp.copy, params), opt_state=sgd.init(params),
                           key=jax.random.PRNGKey(1))
        new_state, metrics = step(state, to_device(batch, None))
        return new_state.params, {k: np.asarray(v) for k, v in metrics.items()}

    return run, params, static


@pytest.fixture(scope="module")
def chat_batch(word_tokenizers, tmp_path_factory):
    """A batch of two windows cut by the training loader from a chat cache whose conversations end
    with a user turn, so the tokens after the last reply are targets only, context for nothing trained on."""
    root = tmp_path_factory.mktemp("loss")
    follow_up = {"role": "user", "content": "Bye"}
    source = _write_jsonl(root / "chats.jsonl", [SYSTEM_USER_ASSISTANT + [follow_up], MULTI_TURN + [follow_up]])
    cache = TokenCache.open(_run(chat_dataset("chat/loss", source=str(source),
                                              tokenizer=str(word_tokenizers["header"])), root / "prefix").cache_path("train"))
    seq_len = int(cache.document_boundaries()[1])  # the first conversation is exactly one window
    windows = TokenWindows.over(cache, seq_len)
    tokens = np.stack([windows.tokens_and_segments(0)[0]] * 2)
    mask = np.stack([windows.loss_mask(0)] * 2)
    mask[1, :] = 0.0
    mask[1, :5] = [0, 1, 1, 0, 1]  # the second row: a few arbitrary positions, none after the last reply
    return Batch(tokens=tokens, loss_mask=mask), cache


def test_perturbing_masked_out_targets_leaves_loss_and_gradient_bit_identical(sgd_step, chat_batch):
    run, _, _ = sgd_step
    batch, cache = chat_batch
    trained_targets = np.flatnonzero(batch.loss_mask[0]) + 1
    last_trained = trained_targets.max()
    assert last_trained < batch.seq_len - 3  # the follow-up user turn comes after every trained target
    params, metrics = run(batch)
    changed = batch.tokens.copy()
    changed[:, last_trained + 1 :] = (changed[:, last_trained + 1 :] + 7) % 20  # other user tokens, same positions
    params2, metrics2 = run(Batch(tokens=changed, loss_mask=batch.loss_mask))
    assert metrics2["loss"].tobytes() == metrics["loss"].tobytes()
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    # ...while changing a trained target does change them: the test can see a difference.
    touched = batch.tokens.copy()
    touched[0, last_trained] = (touched[0, last_trained] + 7) % 20
    _, metrics3 = run(Batch(tokens=touched, loss_mask=batch.loss_mask))
    assert metrics3["loss"] != metrics["loss"]


def test_loss_is_the_mean_cross_entropy_over_masked_in_positions(sgd_step, chat_batch):
    run, params, static = sgd_step
    batch, _ = chat_batch
    _, metrics = run(batch)
    logits = np.asarray(eqx.combine(params, static).forward(jnp.asarray(batch.tokens)).logits, dtype=np.float32)
    # Independently, in numpy float32: log-softmax at every position, the next token's log-probability.
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    nll = -np.take_along_axis(log_probs[:, :-1], batch.tokens[:, 1:, None].astype(np.int64), axis=-1)[..., 0]
    weights = batch.loss_mask[:, :-1]
    expected = float((nll * weights).sum() / weights.sum())
    assert float(metrics["loss_tokens"]) == weights.sum()
    assert float(metrics["loss"]) == pytest.approx(expected, rel=1e-5)


# -- a tiny fine-tuning run learns the replies --------------------------------------------------------

FRUITS = {"apple": "red", "banana": "yellow", "lime": "green", "plum": "purple", "orange": "orange", "grape": "green",
          "cherry": "red", "lemon": "yellow", "kiwi": "brown", "blueberry": "blue"}


def _fruit_chats(count: int, seed: int) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    names = sorted(FRUITS)
    chats = []
    for _ in range(count):
        fruit = names[int(rng.integers(len(names)))]
        chats.append([
            {"role": "system", "content": "You answer in one short sentence."},
            {"role": "user", "content": f"What color is a {fruit}? Tell me please, I would like to know."},
            {"role": "assistant", "content": f"A {fruit} is {FRUITS[fruit]}."},
        ])
    return chats


def test_a_tiny_sft_run_halves_the_assistant_token_loss(tmp_path):
    chats = _fruit_chats(200, seed=0)
    texts = [m["content"] for chat in chats for m in chat]
    folder = _save(train_bpe_tokenizer(texts, 384, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
                   tmp_path / "tokenizer", None)
    train = _write_jsonl(tmp_path / "train.jsonl", chats)
    validation = _write_jsonl(tmp_path / "validation.jsonl", _fruit_chats(20, seed=1))
    data = chat_dataset("chat/fruits", source=str(train), tokenizer=str(folder), validation=str(validation))
    model = sft("checkpoints/fruits-sft", model=TINY, datasets={data: 1.0}, optimizer=AdamConfig(learning_rate=1e-2),
                batch_size=8, seq_len=128, num_train_steps=40)
    prefix = tmp_path / "prefix"
    runner = StepRunner(prefix=str(prefix))
    runner.run([model])
    result = load_artifact(runner.output_path_for(model), TrainedModel).result
    losses = [record["loss"] for record in read_metrics(result.metrics_path) if "loss" in record]
    vocab_size = load_tokenizer(str(folder)).vocab_size
    assert len(losses) == 40 and losses[0] == pytest.approx(math.log(vocab_size), rel=0.1)  # untrained: ~uniform
    assert losses[-1] <= losses[0] / 2, losses
    # The loss is over the replies only: far fewer tokens than the windows hold.
    tokens = [record["loss_tokens"] for record in read_metrics(result.metrics_path) if "loss_tokens" in record]
    assert 0 < tokens[0] < 8 * 127 / 3


def test_sft_whose_replies_lie_past_every_window_is_refused_before_training(word_tokenizers, tmp_path):
    # A 400-token user turn and a two-word reply: at seq_len=64 the reply lands past the last full
    # window, so every training step would see prompt tokens only (loss 0.0000 throughout).
    long_turn = [{"role": "user", "content": "Hi " * 200}, {"role": "assistant", "content": "Hello there."}]
    source = _write_jsonl(tmp_path / "chats.jsonl", [long_turn])
    data = chat_dataset("chat/long", source=str(source), tokenizer=str(word_tokenizers["header"]))
    model = sft("checkpoints/long-sft", model=TINY, datasets={data: 1.0}, batch_size=2, seq_len=64, num_train_steps=2)
    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    with pytest.raises(StepRunFailed, match=r"NoRepliesInWindowsError: .*none of its \d+ reply tokens.*seq_len=64.*from the left"):
        runner.run([model])
    assert not (Path(runner.output_path_for(model)) / "metrics.jsonl").exists()


def test_sft_takes_a_mesh_and_refuses_one_its_batch_does_not_split_over(word_tokenizers, tmp_path):
    from fray.cluster import ResourceConfig
    from levanter.trainer import MeshConfig
    from levanter.trainer.config import MeshConfigError

    source = _write_jsonl(tmp_path / "chats.jsonl", [MULTI_TURN] * 4)
    data = chat_dataset("chat/multi", source=str(source), tokenizer=str(word_tokenizers["header"]))
    args = dict(model=TINY, datasets={data: 1.0}, batch_size=2, seq_len=16, num_train_steps=2)
    on_cpu = sft("checkpoints/multi-sft", **args)
    on_gpus = sft("checkpoints/multi-sft", **args, resources=ResourceConfig.with_gpu("H100", 2), mesh=MeshConfig(data=2))
    assert on_cpu.identity == on_gpus.identity
    assert on_gpus.annotations["mesh"] == {"data": 2, "fsdp": 1, "experts": 1, "model": 1}
    with pytest.raises(MeshConfigError, match="batch_size=2 does not split into whole rows over the data x fsdp x experts = 4"):
        sft("checkpoints/multi-sft", **args, mesh=MeshConfig(data=1, fsdp=4))


def test_sft_can_refuse_conversations_cut_by_the_windows(word_tokenizers, tmp_path):
    source = _write_jsonl(tmp_path / "chats.jsonl", [MULTI_TURN] * 40)
    data = chat_dataset("chat/multi", source=str(source), tokenizer=str(word_tokenizers["header"]))
    model = sft("checkpoints/multi-sft", model=TINY, datasets={data: 1.0}, batch_size=2, seq_len=16, num_train_steps=2,
                on_cut_conversation="refuse")
    with pytest.raises(StepRunFailed, match=r"CutConversationError: .* of 40 conversations are cut by a window boundary"):
        StepRunner(prefix=str(tmp_path / "prefix")).run([model])
    with pytest.raises(TrainConfigError, match="on_cut_conversation"):
        sft("checkpoints/x", model=TINY, datasets={data: 1.0}, batch_size=2, seq_len=16, num_train_steps=2,
            on_cut_conversation="skip")
