"""MediaWiki dump pages -> plain-text paragraphs, with a real wikitext parser (mwparserfromhell).

Dropped: templates (infoboxes, citations, navboxes), tables, `<ref>` and other non-prose tags,
comments, headings, category/file/interwiki links, list and indentation markup, and everything from
the trailing reference sections ("References", "External links", ...) on. Kept: prose, with links
replaced by their visible text.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import mwparserfromhell
from mwparserfromhell.nodes import Comment, Heading, Tag, Template, Text, Wikilink
from mwparserfromhell.smart_list import SmartList
from mwparserfromhell.wikicode import Wikicode

# Link targets that are not prose: [[Category:..]], [[File:..]], [[Image:..]], interwiki [[de:..]].
# An interwiki prefix is followed by the title with no space ([[de:Berlin]], [[zh-yue:..]]); a colon
# and a space is an article's title ([[Ali: Fear Eats the Soul]]), which is prose.
_NON_PROSE_LINK = re.compile(r"^\s*:?\s*((category|file|image|media|wikipedia|wp|template|help|portal)\s*:"
                             r"|[a-z]{2,3}(-[a-z]+)?:(?!\s))", re.I)
_DROPPED_TAGS = {"ref", "references", "table", "gallery", "math", "chem", "timeline", "score", "syntaxhighlight",
                 "source", "pre", "code", "imagemap", "div", "noinclude", "includeonly", "templatedata", "graph"}
_TRAILING_SECTIONS = {"references", "external links", "see also", "further reading", "notes", "bibliography",
                      "sources", "footnotes", "citations", "notes and references"}
_LIST_PREFIX = re.compile(r"^[*#:;]+\s*")
# References and comments go before parsing (as WikiExtractor does): they are a large share of an
# article's markup, and an unbalanced one can make the parser keep it as literal text.
_REFS = re.compile(r"<ref\b[^>/]*/>|<ref\b[^>]*>.*?</ref\s*>", re.S | re.I)
_COMMENTS = re.compile(r"<!--.*?-->", re.S)
# File/image links (with one level of nested links in the caption) trip the parser when the caption
# holds odd markup; they are never prose.
_FILE_LINKS = re.compile(r"\[\[\s*(?:file|image)\s*:(?:[^\[\]]|\[\[[^\[\]]*\]\])*\]\]", re.I)
_BROKEN_MARKUP = ("[[", "]]", "{{", "}}", "{|", "|}")
_TEMPLATE_BRACES = re.compile(r"\{\{|\}\}")
_TABLE_BRACES = re.compile(r"\{\||\|\}")


def _drop_nested(text: str, pattern: re.Pattern, opener: str) -> str:
    """Remove balanced (nested) spans such as templates and tables in one linear scan.

    Templates and tables are most of an article's markup and never prose; cutting them before the
    parser runs makes mwparserfromhell several times faster. An unclosed span is left to the parser.
    """
    out, depth, last, outer_start = [], 0, 0, 0
    for m in pattern.finditer(text):
        if m.group() == opener:
            if depth == 0:
                out.append(text[last : m.start()])
                outer_start = m.start()
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                last = m.end()
    out.append(text[outer_start:] if depth > 0 else text[last:])
    return "".join(out)


# HTML-style tags, opening or closing; a self-closing one ends in "/>".
_HTML_TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9]*)\b[^<>]*>")
# Tags that take no closing tag, which the parser knows as such.
_VOID_TAGS = {"br", "wbr", "hr", "img", "meta", "link"}


def _drop_comments(text: str) -> str:
    """Remove comments; an unclosed `<!--` goes and the text after it stays (as WikiExtractor keeps it).

    Every `<!--` after the last `-->` is unclosed; handled apart, so that the regex does not search
    the rest of the page once for each of them.
    """
    cut = text.rfind("-->") + 3 if "-->" in text else 0
    return _COMMENTS.sub("", text[:cut]) + text[cut:].replace("<!--", "")


def _drop_unclosed_tags(text: str) -> str:
    """Remove opening tags that no later closing tag of their name matches, in one linear scan.

    mwparserfromhell (and the reference regex) search the rest of the page for each one's closing
    tag before giving up and keeping it as literal text, which `_LEFTOVER_TAG` then strips: a page
    with thousands of them (a table pasted as `<td>`-less HTML, a bot's broken `<ref>`s) took
    minutes. Removing them first gives the same paragraphs in linear time.
    """
    open_tags: dict[str, list[tuple[int, int]]] = {}
    for m in _HTML_TAG.finditer(text):
        name = m.group(2).lower()
        if m.group(1):
            if open_tags.get(name):
                open_tags[name].pop()
        elif name not in _VOID_TAGS and not m.group().endswith("/>"):
            open_tags.setdefault(name, []).append(m.span())
    unclosed = sorted(span for spans in open_tags.values() for span in spans)
    if not unclosed:
        return text
    out, last = [], 0
    for start, end in unclosed:
        out.append(text[last:start])
        last = end
    out.append(text[last:])
    return "".join(out)


# Unclosed spans the parser searches the rest of the page for, once each: `{{`, `[[`, `{|` (balanced ones are
# gone by then) and external links. Its time grows with their square: 4,000 `{{` in a 24 KB page took 15 s.
_PAIRS = ((_TEMPLATE_BRACES, "{{"), (re.compile(r"\[\[|\]\]"), "[["), (_TABLE_BRACES, "{|"))
_EXTERNAL_LINK = re.compile(r"\[(?:[a-z][a-z0-9+.-]*:)?//", re.I)
MAX_UNCLOSED = 200  # real articles have a handful at most; 200 costs the parser seconds at worst


def _unclosed(text: str) -> int:
    """How many `{{`, `[[`, `{|` and `[http...` spans of `text` nothing closes (an external link closes on its line)."""
    count = 0
    for pattern, opener in _PAIRS:
        depth = 0
        for m in pattern.finditer(text):
            if m.group() == opener:
                depth += 1
            elif depth:
                depth -= 1
        count += depth
    for line in text.split("\n"):
        links = len(_EXTERNAL_LINK.findall(line))
        if links:
            count += max(0, links - line.count("]"))
    return count


_LEFTOVER_TAG = re.compile(r"</?[a-zA-Z][^>]{0,200}>")


@dataclass(frozen=True)
class WikiPage:
    page_id: str
    title: str
    namespace: int
    is_redirect: bool
    text: str


def parse_page(page_xml: bytes | str) -> WikiPage:
    """One `<page>...</page>` element of a pages-articles dump (UTF-8 bytes, or text). Raises `ET.ParseError`
    if malformed."""
    elem = ET.fromstring(page_xml)
    # Pages cut out of the dump carry no namespace prefix; strip one if a caller kept it.
    for node in elem.iter():
        if isinstance(node.tag, str) and node.tag.startswith("{"):
            node.tag = node.tag.split("}", 1)[1]
    page_id = (elem.findtext("id") or "").strip()
    if not page_id:
        raise ET.ParseError("page has no <id>")
    ns_text = (elem.findtext("ns") or "0").strip()
    try:
        namespace = int(ns_text)
    except ValueError as err:
        raise ET.ParseError(f"page {page_id} has a non-numeric <ns> {ns_text!r}") from err
    text = elem.findtext("revision/text") or ""
    return WikiPage(
        page_id=page_id,
        title=(elem.findtext("title") or "").strip(),
        namespace=namespace,
        is_redirect=elem.find("redirect") is not None or text.lstrip().lower().startswith("#redirect"),
        text=text,
    )


def _unwanted(node) -> bool:
    if isinstance(node, (Template, Comment)):
        return True
    if isinstance(node, Tag):
        return str(node.tag).strip().lower() in _DROPPED_TAGS or node.wiki_markup == "{|"
    return isinstance(node, Wikilink) and bool(_NON_PROSE_LINK.match(str(node.title)))


def wikitext_to_paragraphs(wikitext: str) -> list[str]:
    """Plain-text paragraphs (one per source line that holds prose) of an article's wikitext."""
    text = _REFS.sub("", _drop_unclosed_tags(_drop_comments(wikitext)))
    text = _drop_nested(_drop_nested(text, _TEMPLATE_BRACES, "{{"), _TABLE_BRACES, "{|")
    text = _FILE_LINKS.sub("", text)
    unclosed = _unclosed(text)
    if unclosed > MAX_UNCLOSED:  # the reader counts the page as a wikitext_parse_error, with this message
        raise ValueError(f"{unclosed:,} unclosed '{{{{', '[[', '{{|' or '[http' spans, over {MAX_UNCLOSED}: the parser "
                         "would take minutes on this page")
    code = mwparserfromhell.parse(text)
    kept = []
    for node in code.nodes:
        if isinstance(node, Heading):
            if node.title.strip_code().strip().lower() in _TRAILING_SECTIONS:
                break
            kept.append(Text("\n"))  # a heading ends the paragraph before it
        elif isinstance(node, Tag) and str(node.tag).strip().lower() == "br":
            kept.append(Text(" "))
        elif not _unwanted(node):
            kept.append(node)
    prose = Wikicode(SmartList(kept))
    # Unbalanced markup can nest a file link or template inside a kept node: remove those too.
    for node in prose.filter(recursive=True, forcetype=(Template, Comment, Tag, Wikilink)):
        if _unwanted(node):
            try:
                prose.remove(node)
            except ValueError:  # already gone with an enclosing node
                pass
    # The remaining markup (bold/italic tags, links) renders to its visible text; no second parse.
    plain = prose.strip_code(normalize=True, collapse=True)
    paragraphs = []
    for line in plain.split("\n"):
        line = _LEFTOVER_TAG.sub("", _LIST_PREFIX.sub("", line)).strip()
        # Leftovers of broken markup and one-word list items are not prose.
        if len(line) < 20 or line.startswith(("|", "!")) or any(m in line for m in _BROKEN_MARKUP):
            continue
        paragraphs.append(" ".join(line.split()))
    return paragraphs
