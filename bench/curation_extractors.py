"""Which HTML extractor to use: trafilatura or resiliparse, on pages with known article text.

Builds a sample offline (article paragraphs from the project's story generator, wrapped in page
templates with navigation, sidebars, cookie banners, comments and footers), extracts each page
with both, and prints token-level precision (how much of the output is article) and recall (how
much of the article is recovered), and pages per second. Run: python bench/curation_extractors.py
"""

from __future__ import annotations

import html as html_lib
import time
from collections import Counter

from marin.curation.extract import extract_text
from storygen import generate_stories

NAV = "<nav><ul>{}</ul></nav>".format("".join(f'<li><a href="/{w}">{w.title()}</a></li>' for w in
                                            ["home", "news", "sports", "weather", "about us", "contact", "subscribe"]))
FOOTER = ("<footer><p>Copyright 2024 Example Media Group. All rights reserved.</p><p><a href='/privacy'>Privacy policy</a>"
          " | <a href='/terms'>Terms of use</a> | <a href='/cookies'>Cookie settings</a></p></footer>")
SIDEBAR = ("<aside class='sidebar'><h3>Most read</h3><ul><li><a href='/a'>Ten tricks to save money on groceries</a></li>"
           "<li><a href='/b'>Local team wins the regional cup again</a></li><li><a href='/c'>Weather warning for the weekend</a>"
           "</li></ul><div class='ad'>Advertisement: Buy the new phone today with free shipping</div></aside>")
COOKIE = "<div id='cookie-banner'>We use cookies to improve your experience. <button>Accept all</button></div>"
COMMENTS = ("<section class='comments'><h3>Comments</h3><div class='comment'>Great post, thanks!</div>"
            "<div class='comment'>First! Check out my channel for more.</div></section>")

TEMPLATES = [
    "<html lang='en'><head><title>{title}</title></head><body>" + NAV + "<main><article><h1>{title}</h1>{body}</article></main>"
    + SIDEBAR + FOOTER + "</body></html>",
    "<html lang='en'><head><title>{title} | Blog</title></head><body>" + COOKIE + "<div id='header'>" + NAV + "</div>"
    "<div id='content'><div class='post'><h2>{title}</h2><div class='entry'>{body}</div></div>" + COMMENTS + "</div>"
    + FOOTER + "</body></html>",
    "<html><head><title>{title}</title></head><body><table><tr><td>" + NAV + "</td><td><div class='story'>{body}</div></td>"
    "<td>" + SIDEBAR + "</td></tr></table>" + FOOTER + "</body></html>",
]


def sample(count: int = 30) -> list[tuple[str, str]]:
    """``(html, article text)`` pairs."""
    pages = []
    for i, story in enumerate(generate_stories(count, seed=8)):
        paragraphs = [p for p in story.split("\n") if p.strip()]
        sentences = " ".join(paragraphs).split(". ")
        chunks = [". ".join(sentences[j:j + 3]) for j in range(0, len(sentences), 3)]
        body = "".join(f"<p>{html_lib.escape(c)}</p>" for c in chunks)
        title = f"Story number {i}"
        pages.append((TEMPLATES[i % len(TEMPLATES)].format(title=title, body=body), " ".join(chunks)))
    return pages


def tokens(text: str) -> Counter:
    return Counter(text.lower().split())


def measure(extractor: str, pages: list[tuple[str, str]]) -> dict[str, float]:
    overlap = produced = expected = 0
    started = time.perf_counter()
    outputs = [extract_text(page, extractor) for page, _ in pages]
    elapsed = time.perf_counter() - started
    for output, (_, truth) in zip(outputs, pages):
        got, want = tokens(output), tokens(truth)
        overlap += sum((got & want).values())
        produced += sum(got.values())
        expected += sum(want.values())
    return {"precision": overlap / max(produced, 1), "recall": overlap / max(expected, 1), "pages_per_second": len(pages) / elapsed}


if __name__ == "__main__":
    pages = sample()
    for name in ("resiliparse", "trafilatura"):
        measure(name, pages[:2])  # warm up imports
        m = measure(name, pages)
        print(f"{name:12s} precision {m['precision']:.3f}  recall {m['recall']:.3f}  {m['pages_per_second']:.0f} pages/s")
