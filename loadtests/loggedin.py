"""The logged-in traffic shape's pieces that need no Locust: its request names, its
documents, reading HTML forms, and the checks of its answers (each returns None when the
answer is right, else the reason, a str, that the locustfile records as the failure).

Standard library only: the locustfile imports it from beside itself (the loadgenerator
role copies it there), and the report tools import it without Locust's gevent patching.

What a simulated editor does (``loadtests/locustfile.py``, ``LoggedInUser``): log in once
through Plone's login form (``/Plone/login``: ``__ac_name``, ``__ac_password``, the
``buttons.login`` button, as ``Products.CMFPlone.browser.login.login.LoginForm`` reads
them; the ``__ac`` cookie of plone.session then carries the login), then in turn: the
front page as a Member, the contents of the folder it edits in, the edit form of its own
document and a save of that form (its ``_authenticator`` CSRF token of plone.protect and
every other field as a browser sends them, the text changed).
"""
import html
import re
from html.parser import HTMLParser

#: The path class of the shape in the reports (the A/B's per-path verdicts).
LOGGED_IN = "logged-in"
#: Request names in Locust's statistics, in the order an editor sends them (one name per
#: request: the reports key their tables by name, so a GET and a POST need two).
REQUESTS = {
    "login_form": "logged-in login form",
    "login": "logged-in login",
    "front": "logged-in /Plone/view",
    "contents": "logged-in folder contents",
    "edit": "logged-in edit form",
    "save": "logged-in save",
}
#: The requests the path class LOGGED_IN stands for in the A/B's verdicts: the pages HAProxy
#: balances over the pool. Not the POSTs (login, save): the kit's HAProxy sends every POST
#: through its write lane, one at a time to the first client (haproxy.cfg.j2, backend
#: writes), so which server answers them says nothing about the servers' speed.
CLASS_REQUESTS = tuple(REQUESTS[k] for k in ("front", "contents", "edit"))
#: What scripts/create_site.py makes (tests/test_loggedin.py checks that they agree):
#: users editor1..EDITORS, documents doc-01..doc-DOCUMENTS in the folder EDIT_FOLDER.
EDITORS = 10
DOCUMENTS = 40
EDIT_FOLDER = "/Plone/editing"
#: The front page as a Member: the site's default view, named apart from the anonymous
#: ``/Plone`` so that HAProxy's log (``loadtests.core.haproxy_log.LOG_PATHS``) keeps them apart.
FRONT_PAGE = "/Plone/view"
LOGIN_FORM = "/Plone/login"
LOGIN_BUTTON = "buttons.login"
SAVE_BUTTON = "form.buttons.save"
#: The Document's text in its edit form (plone.app.contenttypes' rich text behaviour).
TEXT_FIELD = "form.widgets.IRichTextBehavior.text"
#: Plone's personal tools offer "Log out" only to a logged-in user (and name the user: its
#: id, since the editors have no full name).
LOGGED_IN_MARK = 'id="personaltools-logout"'
#: The folder contents page is a shell for the structure pattern (mockup), which lists.
CONTENTS_MARK = "pat-structure"
#: Why a save failed when the page after it shows the text from before: the redirect's GET
#: reached another ZEO client than the one that wrote, which serves what it had until ZEO's
#: invalidation of the save reaches it (ZEO's server-sync is off by default). The kit's
#: HAProxy prevents it (the cookie lb_wrote sends a writer's reads to the writing client for
#: 10 s); a balancer without that shows it under load.
STALE_PAGE = "the saved text is not on the page"
#: The paragraph a save appends (and the next save replaces): ``<p class=...>... MARK</p>``.
_SAVED_PARAGRAPH = re.compile(r'\s*<p class="loadtest-edit">.*?</p>', re.S)


def assignment(index):
    """``(user id, document path)`` of simulated editor number ``index`` (0, 1, ...): users
    in turn over the EDITORS accounts, documents over the DOCUMENTS documents, so that up
    to DOCUMENTS simultaneous editors never save the same document (a write conflict)."""
    if index < 0:
        raise ValueError(f"editor index {index} is negative")
    return f"editor{index % EDITORS + 1}", f"{EDIT_FOLDER}/doc-{index % DOCUMENTS + 1:02d}"


class Form:
    """One HTML ``<form>``: ``action`` and ``method`` as written (unescaped), ``fields``:
    the ``[(name, value)]`` a browser submits (hidden and text inputs, checked boxes and
    radios, selected options, textareas; no buttons), ``buttons``: ``{name: value}`` of its
    submit buttons."""

    def __init__(self, action, method):
        self.action, self.method = action, method
        self.fields, self.buttons = [], {}

    def value(self, name):
        """The first value submitted under ``name``, or None."""
        return next((v for n, v in self.fields if n == name), None)

    def submission(self, button, changes=None):
        """``[(name, value)]`` to POST when ``button`` is pressed, with the values of
        ``changes`` (``{name: value}``) instead of the form's. KeyError names a button
        that the form lacks."""
        if button not in self.buttons:
            raise KeyError(f"no button {button!r} in the form (buttons: {', '.join(self.buttons) or 'none'})")
        changes = dict(changes or {})
        out = [(n, changes.pop(n)) if n in changes else (n, v) for n, v in self.fields]
        return out + list(changes.items()) + [(button, self.buttons[button])]


class _FormParser(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.forms, self._form = [], None
        self._textarea = self._select = None  # [name, text parts] / [name, multiple, options]

    def handle_starttag(self, tag, attrs):
        a = {k: v if v is not None else "" for k, v in attrs}
        if tag == "form":
            self._form = Form(a.get("action", ""), a.get("method", "get").lower())
            self.forms.append(self._form)
        elif tag == "option":
            if self._select is not None:
                self._select[2].append((a.get("value"), "selected" in a, []))
        elif self._form is None or "name" not in a or "disabled" in a:
            return  # not submitted
        elif tag == "input":
            kind = a.get("type", "text").lower()
            if kind in ("submit", "image"):
                self._form.buttons[a["name"]] = a.get("value", "")
            elif kind in ("checkbox", "radio"):
                if "checked" in a:
                    self._form.fields.append((a["name"], a.get("value", "on")))
            elif kind not in ("button", "reset", "file"):
                self._form.fields.append((a["name"], a.get("value", "")))
        elif tag == "button" and a.get("type", "submit").lower() == "submit":
            self._form.buttons[a["name"]] = a.get("value", "")
        elif tag == "textarea":
            self._textarea = [a["name"], []]
        elif tag == "select":
            self._select = [a["name"], "multiple" in a, []]

    def handle_data(self, data):
        if self._textarea is not None:
            self._textarea[1].append(data)
        elif self._select is not None and self._select[2]:
            self._select[2][-1][2].append(data)

    def handle_endtag(self, tag):
        if tag == "form":
            self._form = None
        elif tag == "textarea" and self._textarea is not None:
            name, parts = self._textarea
            text = "".join(parts)
            # A browser drops the one newline that follows <textarea> (HTML's parsing rules).
            self._form.fields.append((name, text[1:] if text.startswith("\n") else text))
            self._textarea = None
        elif tag == "select" and self._select is not None:
            name, multiple, options = self._select
            values = [(v if v is not None else "".join(t).strip()) for v, selected, t in options if selected]
            if not values and options and not multiple:  # a browser sends the first option
                value, _, text = options[0]
                values = [value if value is not None else "".join(text).strip()]
            self._form.fields.extend((name, v) for v in values)
            self._select = None


def forms(page):
    """The ``<form>`` elements of the HTML text ``page`` (a str), as :class:`Form`, in order."""
    parser = _FormParser()
    parser.feed(page)
    parser.close()
    return parser.forms


def form_with(page, button):
    """The first form of ``page`` with a submit button named ``button``, or None."""
    return next((f for f in forms(page) if button in f.buttons), None)


def not_logged_in(page, user_id):
    """Reason (str) why ``page`` is not a page for the logged-in ``user_id``, or None."""
    if "<html" not in page[:2000].lower():
        return "not an HTML page"
    if LOGGED_IN_MARK not in page:
        return f"not logged in as {user_id}: no log-out link ({LOGGED_IN_MARK}) in the page"
    if not re.search(rf">\s*{re.escape(user_id)}\s*<", page):
        return f"logged in, but not as {user_id}: the user id is not in the page"
    return None


def not_folder_contents(page, user_id):
    """Reason why ``page`` is not the logged-in folder contents page, or None."""
    return not_logged_in(page, user_id) or (
        None if CONTENTS_MARK in page else f"no folder listing ({CONTENTS_MARK}) in the page")


def edit_form(page, user_id):
    """``(form, None)``: the :class:`Form` of ``page``, the logged-in edit form of a Document
    (a form with the save button, the text field and plone.protect's ``_authenticator``
    token); else ``(form or None, reason)``."""
    reason = not_logged_in(page, user_id)
    if reason:
        return None, reason
    form = form_with(page, SAVE_BUTTON)
    if form is None:
        return None, f"no form with the button {SAVE_BUTTON}"
    missing = [name for name in (TEXT_FIELD, "_authenticator") if form.value(name) is None]
    return form, f"the edit form lacks {', '.join(missing)}" if missing else None


def edited_text(text, user_id, mark):
    """``text`` (the Document's HTML) with its last edit paragraph replaced by a new one
    naming ``user_id`` and ending in ``mark`` (so the text does not grow with every save)."""
    paragraph = (f'<p class="loadtest-edit">Edited by {html.escape(user_id)} in the logged-in load test, '
                 f"mark {html.escape(mark)}</p>")
    return _SAVED_PARAGRAPH.sub("", text).rstrip() + "\n" + paragraph


def not_saved(page, user_id, mark):
    """Reason why ``page`` (the answer to a save, after its redirect) does not show the
    saved text ending in ``mark``, or None."""
    reason = not_logged_in(page, user_id)
    if reason:
        return reason
    if f"mark {mark}" in page:
        return None
    if form_with(page, SAVE_BUTTON) is not None:
        return "the save answered with the edit form again (a validation error?), not the saved page"
    # No mark in the reason: Locust counts failures by their text.
    return STALE_PAGE
