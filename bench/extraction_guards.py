"""What the extraction guards cost, and what they keep out (marin.curation.page_guard).

Prints, in one run on this machine:
- the guards' scan beside resiliparse's extraction of the same ordinary pages (a small one and a
  166 KB one with 8,000 tags), per page;
- the cost of nesting: extraction of pages of N nested <div>s, growing with the square of N;
- the slowest pages the guards still let through (at the depth, nesting and size limits), in CPU
  seconds beside the per-page time limit, and the guards' own scan of a hostile 1 MiB page;
- what extraction through its own process (marin.curation.extraction_process, as a curation step
  extracts) costs beside extraction in this process, per ordinary page, in wall and CPU time (this
  process and its children together);
- pages the guards' scan sees as flat that an HTML parser nests 100,000 deep, stopped at the CPU limit.

Run: python bench/extraction_guards.py
"""

from __future__ import annotations

import os
import resource
import time

from curation_extractors import sample
from marin.curation.extract import extract_text, page_record
from marin.curation.extraction_process import extract_within
from marin.curation.page_guard import MAX_DEPTH, MAX_NESTING, MAX_PAGE_BYTES, PAGE_TIME_LIMIT_S, nesting, page_problem


def cpu_seconds(fn, repeat: int = 1) -> float:
    started = time.thread_time()
    for _ in range(repeat):
        fn()
    return (time.thread_time() - started) / repeat


def tree_cpu() -> float:
    """CPU seconds of this process and its children, live (the extraction process) or ended and waited for."""
    from process_sampler import tree_cpu_seconds

    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + tree_cpu_seconds(os.getpid()) + ended.ru_utime + ended.ru_stime


def wall_and_cpu(fn, repeat: int = 1) -> tuple[float, float]:
    """Seconds per call: wall, and CPU of this process and its children."""
    started, cpu = time.perf_counter(), tree_cpu()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - started) / repeat, (tree_cpu() - cpu) / repeat


def largest(build, limit_of) -> str:
    """The largest page ``build(k)`` whose ``limit_of`` stays within its limit (k grows until it would not)."""
    k = 1
    while limit_of(build(k + 1)):
        k += 1
    return build(k)


if __name__ == "__main__":
    pages = [page for page, _ in sample(30)]
    big = pages[0].replace("</article>", "".join(pages[1:]) * 3 + "</article>")
    extract_text(pages[0])  # import and warm up
    print("ordinary pages: guards vs extraction (CPU ms per page)")
    for label, page, repeat in (("small page", pages[0], 200), ("166 KB page", big, 20)):
        body = page.encode()
        guard = cpu_seconds(lambda: page_problem(body, page), repeat)  # noqa: B023 - used at once
        extract = cpu_seconds(lambda: extract_text(page), repeat)  # noqa: B023
        print(f"  {label:12s} {len(body):>8,} bytes  guards {guard * 1e3:7.3f}  extraction {extract * 1e3:7.3f}  "
              f"({guard / extract:.0%} of extraction)")

    print("nested <div>s, unguarded extraction (CPU s): cost grows with depth squared")
    for depth in (1000, 2000, 4000):
        page = "<html><body>" + "<div>" * depth + "x" + "</div>" * depth
        print(f"  depth {depth:>5,}: {cpu_seconds(lambda: extract_text(page)):.2f} s")  # noqa: B023

    print(f"slowest pages the guards let through, beside the time limit of {PAGE_TIME_LIMIT_S:g} s (CPU s)")
    cases = {
        f"depth {MAX_DEPTH}": "<html><body>" + "<div>" * (MAX_DEPTH - 2) + "x" + "</div>" * (MAX_DEPTH - 2),
        f"nesting near {MAX_NESTING:,}": largest(lambda k: "<html><body>" + ("<div>" * 64 + "hi " + "</div>" * 64) * k,
                                                 lambda page: nesting(page.encode())[1] <= MAX_NESTING),
        f"flat page near {MAX_PAGE_BYTES:,} bytes": largest(
            lambda k: "<html><body>" + "<p>hello world, a paragraph of text here.</p>" * (1000 * k),
            lambda page: len(page.encode()) <= MAX_PAGE_BYTES),
    }
    for label, page in cases.items():
        assert page_problem(page.encode(), page) is None, label
        print(f"  {label:34s} {len(page.encode()):>9,} bytes  {cpu_seconds(lambda: extract_text(page)):.2f} s")  # noqa: B023

    comments = "<!---->" * (MAX_PAGE_BYTES // 7)
    print(f"  guards' scan of {len(comments):,} bytes of empty comments: "
          f"{cpu_seconds(lambda: page_problem(comments.encode(), comments)):.2f} s")

    mid = pages[0].replace("</article>", "".join(pages[1:8]) * 3 + "</article>")
    extract_within(pages[0], "resiliparse", PAGE_TIME_LIMIT_S, "warm-up")  # starts the extraction process
    print("ordinary pages: extraction in this process vs through the extraction process (ms per page, best of 3)")
    for label, page, repeat in (("small page", pages[0], 400), ("41 KB page", mid, 100), ("166 KB page", big, 30)):
        here = min(wall_and_cpu(lambda: extract_text(page), repeat) for _ in range(3))  # noqa: B023
        apart = min(wall_and_cpu(lambda: extract_within(page, "resiliparse", PAGE_TIME_LIMIT_S, "bench"), repeat)  # noqa: B023
                    for _ in range(3))
        print(f"  {label:12s} {len(page.encode()):>8,} bytes  in this process {here[0] * 1e3:7.3f} wall "
              f"{here[1] * 1e3:7.3f} CPU   through it {apart[0] * 1e3:7.3f} wall {apart[1] * 1e3:7.3f} CPU  "
              f"({apart[1] / here[1] - 1:+.0%} CPU, {apart[0] / here[0] - 1:+.0%} wall; {1 / apart[0]:,.0f} pages/s)")

    print(f"pages the guards' scan sees as flat, 100,000 elements deep to a parser, stopped at {PAGE_TIME_LIMIT_S:g} s of CPU")
    for unit in ("<div/>", "<div></x>"):
        body = ("<html><body>" + unit * 100_000 + "x").encode()
        assert page_problem(body, body.decode()) is None, unit
        record: dict = {}
        wall, cpu = wall_and_cpu(lambda: record.update(page_record(body, "bench", None, None, "resiliparse")))  # noqa: B023
        print(f"  {unit:10s} x 100,000 ({len(body):,} bytes): {record['extract_reason']} after {wall:.2f} s wall, "
              f"{cpu:.2f} s CPU")
