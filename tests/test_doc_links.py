"""Every relative link in README.md, BENCHMARKS.md and docs/*.md leads somewhere in the repository.

A markdown link or image `[text](target)` (and a reference definition `[name]: target`) whose
target is not a web address (http, https, mailto) must name an existing file or directory,
relative to the document, inside the repository; its `#anchor`, and a link that is only an
`#anchor`, must be a heading of the target markdown file by GitHub's rule (the heading's text with
code, links and emphasis marks removed, lowercased, every character but letters, digits, `_`, `-`
and spaces dropped, spaces to hyphens, `-1`, `-2`... on repeats) or an HTML `id`/`name` in it.
Only ATX headings (`# ...`) outside code blocks count; setext headings (a line of `===`) are not
read, and none of the documents uses them. Links inside code (fenced blocks, `inline code`) are
not links. Nothing may point outside the repository, in a link or in plain text: a `../` path
that leaves the checkout (read from the repository root, as paths in these documents are written),
an absolute link target or another URL scheme, such as `../shared/DESIGN.md`, a file that exists
on one machine but not in a clone.
"""

import pathlib
import re
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
WEB = ("http:", "https:", "mailto:")
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$", re.M)
HTML_ID = re.compile(r"<[a-z][^>]*\s(?:id|name)=[\"']([^\"']+)[\"']", re.I)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
UP = re.compile(r"(?<![\w./-])(?:\./)?(?:\.\./)+[\w.~/-]*")


def documents(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
  return [root / "README.md", root / "BENCHMARKS.md", *sorted((root / "docs").glob("*.md"))]


def _prose(text: str) -> str:
  """The text without code: fenced blocks and inline code spans removed."""
  return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
  """GitHub's anchor for a heading's text (before repeats are numbered)."""
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
  text = text.replace("`", "").replace("*", "")
  text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # _emphasis_, not snake_case
  return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(doc: pathlib.Path) -> set[str]:
  """Every anchor a link into `doc` may name: its headings' slugs and its HTML ids."""
  text = doc.read_text(encoding="utf-8")
  found, seen = set(), {}
  for heading in HEADING.findall(FENCE.sub("", text)):
    base = slug(heading)
    n = seen.get(base, 0)
    seen[base] = n + 1
    found.add(base if n == 0 else f"{base}-{n}")
  return found | set(HTML_ID.findall(text))


def _inside(path: pathlib.Path, root: pathlib.Path) -> bool:
  return path == root or root in path.parents


def targets(text: str) -> list[str]:
  """The targets of the links, images and reference definitions in a document's prose."""
  prose = _prose(text)
  return LINK.findall(prose) + REFERENCE.findall(prose)


def link_problems(doc: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
  """What is wrong with `doc`'s links, one line each (empty: nothing)."""
  root = root.resolve()
  name, out = doc.relative_to(root), []
  for target in targets(doc.read_text(encoding="utf-8")):
    if target.lower().startswith(WEB):
      continue
    if not target:
      out.append(f"{name}: an empty link")
      continue
    if SCHEME.match(target) or target.startswith("/"):
      out.append(f"{name}: {target} points outside the repository (use a relative link)")
      continue
    path_part, _, anchor = target.partition("#")
    dest = (doc.parent / urllib.parse.unquote(path_part)).resolve() if path_part else doc
    if not _inside(dest, root):
      out.append(f"{name}: {target} points outside the repository")
    elif not dest.exists():
      out.append(f"{name}: {target} does not exist")
    elif anchor and dest.suffix == ".md" and urllib.parse.unquote(anchor) not in anchors(dest):
      out.append(f"{name}: {target}: no heading #{anchor} in {dest.relative_to(root)}")
  return out


def outside_references(doc: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
  """Plain-text `../` paths in `doc` (code included; links are `link_problems`'s, read from
  their document) that leave the repository when read from its root."""
  root = root.resolve()
  name = doc.relative_to(root)
  plain = REFERENCE.sub("", LINK.sub("", doc.read_text(encoding="utf-8")))
  return [
      f"{name}: {ref} points outside the repository"
      for ref in (r.rstrip(".") for r in UP.findall(plain))
      if not _inside((root / ref).resolve(), root)
  ]


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
  problems = link_problems(doc)
  assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_points_outside_the_repository(doc):
  problems = outside_references(doc)
  assert not problems, "\n".join(problems)


def test_the_design_page_is_linked_from_the_readme():
  assert "docs/design.md" in targets((ROOT / "README.md").read_text(encoding="utf-8"))


def test_slugs_follow_githubs_rule():
  assert slug("Many islands and Decoupled DiLoCo") == "many-islands-and-decoupled-diloco"
  assert slug("Plans of TPU slices (`experiments.plan`, issue 50, 2026-12-04)") == (
      "plans-of-tpu-slices-experimentsplan-issue-50-2026-12-04"
  )
  assert slug("The `outer.merge_clock` key: *when*") == "the-outermerge_clock-key-when"
  assert slug("Learners: 4 × 2 = 8") == "learners-4--2--8"


def test_a_broken_link_is_caught(tmp_path):
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "b.md").write_text("# Title\n\n## Part one\n\n## Part one\n")
  (tmp_path / "docs" / "pic.png").write_bytes(b"")
  doc = tmp_path / "docs" / "a.md"
  doc.write_text(
      "# A\n\n[ok](b.md) [ok](b.md#part-one) [ok](b.md#part-one-1) ![ok](pic.png) [ok](#a)\n"
      "[web](https://example.com/x) [ok](../docs/) `[code](missing.md)`\n\n"
      "```\n[in a block](missing.md)\n```\n\n"
      "[gone](missing.md) [no heading](b.md#part-two) [self](#nowhere)\n"
      "[out](../../elsewhere.md) ![abs](/etc/passwd) [file](file:///etc/passwd)\n"
      "[ref]: gone_too.md\n"
  )
  assert link_problems(doc, tmp_path) == [
      "docs/a.md: missing.md does not exist",
      "docs/a.md: b.md#part-two: no heading #part-two in docs/b.md",
      "docs/a.md: #nowhere: no heading #nowhere in docs/a.md",
      "docs/a.md: ../../elsewhere.md points outside the repository",
      "docs/a.md: /etc/passwd points outside the repository (use a relative link)",
      "docs/a.md: file:///etc/passwd points outside the repository (use a relative link)",
      "docs/a.md: gone_too.md does not exist",
  ]


def test_a_plain_reference_outside_is_caught(tmp_path):
  doc = tmp_path / "README.md"
  (tmp_path / "docs").mkdir()
  doc.write_text("See `../shared/DESIGN.md`; ./docs/x.md and docs/../README.md stay inside.\n")
  page = tmp_path / "docs" / "page.md"
  page.write_text("[the README](../README.md), then ../README.md as text\n")
  assert outside_references(doc, tmp_path) == [
      "README.md: ../shared/DESIGN.md points outside the repository"
  ]
  assert link_problems(page, tmp_path) == []  # a link is read from its document
  assert outside_references(page, tmp_path) == [  # plain text from the repository's root
      "docs/page.md: ../README.md points outside the repository"
  ]
