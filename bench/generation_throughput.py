"""Generation throughput on this CPU: ``marin serve-model`` against transformers' ``generate``.

    python bench/generation_throughput.py                     # hidden 256, 4 layers, 64 new tokens
    python bench/generation_throughput.py --concurrency 1 8 --new-tokens 32

One random Llama is exported to the Hugging Face format with the project's exporter; transformers
loads that folder (float32, torch on CPU) and ``marin serve-model`` serves it in a subprocess. The
prompts are the opening 16-96 tokens of generated stories, continued greedily. For each
concurrency C the same C prompts are run four ways:

- ``hf_sequential``: ``generate`` on one prompt at a time;
- ``hf_batched``: one ``generate`` call on all C prompts, left-padded;
- ``server_sequential``: the server, one streamed request at a time;
- ``server_concurrent``: C streamed requests at once (continuous batching).

tokens/s counts the new tokens each way actually produced (all ways are greedy on the same
weights, so they stop at the same end-of-text, if any) over the wall time of the whole set; TTFT
is the mean time from a request's start to its first token (for ``hf_batched``, to the first
decoding step of the call). The server is warmed up with one untimed pass per concurrency, as its
programs compile once per shape bucket (the table says how many still compiled while timing). The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--max-seq-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    return p.parse_args()


def build(args, folder):
    import jax
    import numpy as np
    from levanter.compat.hf_checkpoints import export_llama_to_hf
    from levanter.models.llama import LlamaConfig
    from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
    from storygen import generate_stories

    stories = generate_stories(max(args.concurrency) + 100, seed=0)
    tokenizer = train_bpe_tokenizer(stories[100:], args.vocab)
    save_tokenizer(tokenizer, os.path.join(folder, "tokenizer"))
    config = LlamaConfig(hidden_dim=args.hidden, intermediate_dim=args.intermediate, num_layers=args.layers,
                         num_heads=args.heads, num_kv_heads=args.kv_heads, max_seq_len=args.max_seq_len)
    model = config.build(tokenizer.get_vocab_size(), key=jax.random.PRNGKey(0))
    hf = export_llama_to_hf(model, os.path.join(folder, "hf"), tokenizer_dir_or_obj=os.path.join(folder, "tokenizer"))
    eos = tokenizer.token_to_id("<|endoftext|>")
    lengths = np.random.RandomState(0).randint(16, 97, size=len(stories))
    prompts = [[eos, *tokenizer.encode(story).ids[:n - 1]] for story, n in zip(stories[:100], lengths)]
    return hf, prompts, eos


def hf_runs(hf, prompts, args, eos):
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32).eval()
    options = dict(max_new_tokens=args.new_tokens, max_length=None, do_sample=False, eos_token_id=eos, pad_token_id=eos)

    class FirstStep(transformers.LogitsProcessor):
        def __init__(self):
            self.at = None

        def __call__(self, input_ids, scores):
            self.at = self.at or time.perf_counter()
            return scores

    def new_tokens(rows, width):
        count = 0
        for row in rows[:, width:].tolist():
            count += row.index(eos) if eos in row else len(row)
        return count

    def sequential(batch):
        started, tokens, first = time.perf_counter(), 0, []
        for prompt in batch:
            t0, marker = time.perf_counter(), FirstStep()
            out = model.generate(torch.tensor([prompt]), logits_processor=[marker], **options)
            first.append(marker.at - t0)
            tokens += new_tokens(out, len(prompt))
        return tokens, time.perf_counter() - started, sum(first) / len(first)

    def batched(batch):
        width = max(len(p) for p in batch)
        ids = torch.tensor([[eos] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        t0, marker = time.perf_counter(), FirstStep()
        out = model.generate(ids, attention_mask=mask, logits_processor=[marker], **options)
        return new_tokens(out, width), time.perf_counter() - t0, marker.at - t0

    results = {}
    with torch.no_grad():
        sequential(prompts[:1])  # warm-up
        for c in args.concurrency:
            batch = prompts[:c]
            results[("hf_sequential", c)] = sequential(batch)
            results[("hf_batched", c)] = batched(batch)
    return results


async def _request(client, url, prompt, args):
    started = time.perf_counter()
    first, tokens = None, 0
    payload = {"model": "bench", "prompt": prompt, "max_tokens": args.new_tokens, "temperature": 0, "stream": True,
               "stream_options": {"include_usage": True}}
    async with client.stream("POST", url + "/v1/completions", json=payload) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            elif first is None:
                first = time.perf_counter() - started
    return tokens, first if first is not None else time.perf_counter() - started


async def _server_run(url, batch, args, concurrent):
    import httpx

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=len(batch) + 1)) as client:
        started = time.perf_counter()
        if concurrent:
            done = await asyncio.gather(*(_request(client, url, p, args) for p in batch))
        else:
            done = [await _request(client, url, p, args) for p in batch]
        elapsed = time.perf_counter() - started
    return sum(t for t, _ in done), elapsed, sum(f for _, f in done) / len(done)


def server_runs(hf, prompts, args):
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([sys.executable, "-m", "marin.cli", "serve-model", hf, "--name", "bench", "--port", str(port),
                                "--max-batch", str(max(args.concurrency))], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("marin serve-model did not start")
            time.sleep(0.5)
        def compilations():
            text = httpx.get(url + "/metrics", timeout=30).text
            return int(next(line.split()[1] for line in text.splitlines() if line.startswith("marin_serve_compilations_total ")))

        results, warm = {}, None
        for c in args.concurrency:
            batch = prompts[:c]
            for concurrent in (False, True):  # untimed: compiles the shape buckets this way of asking reaches
                asyncio.run(_server_run(url, batch, args, concurrent=concurrent))
            warm = compilations()
            results[("server_sequential", c)] = asyncio.run(_server_run(url, batch, args, concurrent=False))
            results[("server_concurrent", c)] = asyncio.run(_server_run(url, batch, args, concurrent=True))
            # Arrivals interleave differently from run to run, so a timed run can meet a shape the
            # warm-up did not: say how many programs compiled while timing.
            results[("compiled_while_timed", c)] = compilations() - warm
        return results
    finally:
        process.terminate()
        process.wait(timeout=60)


def main():
    args = parse_args()
    with tempfile.TemporaryDirectory() as folder:
        hf, prompts, eos = build(args, folder)
        results = hf_runs(hf, prompts, args, eos) | server_runs(hf, prompts, args)
    ways = ("hf_sequential", "hf_batched", "server_sequential", "server_concurrent")
    print(f"{args.layers} layers, hidden {args.hidden}, vocab {args.vocab}, {args.new_tokens} new tokens per request, "
          f"{args.threads} threads, greedy")
    print(f"{'requests':>8}  {'way':<18} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'TTFT ms':>8}")
    record = {f"compiled_while_timed_{c}": results[("compiled_while_timed", c)] for c in args.concurrency}
    for c in args.concurrency:
        for way in ways:
            tokens, seconds, ttft = results[(way, c)]
            print(f"{c:>8}  {way:<18} {tokens:>7} {seconds:>8.2f} {tokens / seconds:>9.1f} {ttft * 1000:>8.0f}")
            record[f"{way}_{c}"] = {"tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1),
                                    "ttft_ms": round(ttft * 1000, 1)}
        print(f"{'':>8}  (server programs compiled while timing: {results[('compiled_while_timed', c)]})")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
