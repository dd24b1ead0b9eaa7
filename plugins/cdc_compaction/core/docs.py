"""Where a message sends its reader: one section of the docs site, cited one way.

Every message that points at the documentation (an error's fix, a prompt, a hint) names a page of
the site and the anchor of a heading on it with :func:`doc_ref`, never a README section or a
heading's words: pages move and headings are reworded, and a citation nobody resolves goes stale
silently. ``tests/e2e/test_docs.py`` builds the site and checks that every ``doc_ref`` of the package
names a page and an anchor it has.
"""

from __future__ import annotations

import re

#: A page name (``docs/<page>.md``) and an anchor as MkDocs makes them from a heading.
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def doc_ref(page: str, anchor: str = "") -> str:
    """The text a message shows for a docs-site section: ``docs/<page>.md#<anchor>``.

    The same words find it in a clone (the file and its heading), on GitHub and on the built site
    (``<page>/#<anchor>``). ``anchor`` is the heading's id as MkDocs makes it (lower case, words
    joined by ``-``); empty for the page itself.
    """
    if not _NAME.match(page) or (anchor and not _NAME.match(anchor)):
        raise ValueError(f"doc_ref({page!r}, {anchor!r}): a page name and an anchor are lower-case words joined by '-'")
    return f"docs/{page}.md" + (f"#{anchor}" if anchor else "")
