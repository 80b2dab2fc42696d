"""The logged-in traffic shape: its form reading and body checks (loadtests/loggedin.py),
its option in the A/B and its path class in the A/B's verdicts (unit tests), and the shape
run against the real stack through the A/B, the headline's Locust run and the matrix (marker
integration)."""
import ast
import csv
import json
import os
import re
import sys

import pytest
import requests

from conftest import ROOT, SITE_ENV, admin_auth, admin_session, errors_since, log_sizes, port_taken, run
from loadtests import loggedin
from loadtests.ab import abstats, abtest
from loadtests.core import stack as stack_module
from loadtests.core.locustrun import login_problem, row_of, run_locust_shape
from loadtests.matrix import matrix_plan
from loadtests.core.stack import PATHS
from loadtests.headline import headline
from loadtests.weights import DEFAULT_WEIGHTS, parse_weights

LOGGED_IN_PAGE = ('<html><body><h6 class="dropdown-header">editor1</h6>'
                  '<a id="personaltools-logout" href="/Plone/logout">Log out</a>{}</body></html>')

#: An edit form the way Plone writes one (z3c.form, plone.protect's token), beside the
#: search form every page has.
EDIT_PAGE = LOGGED_IN_PAGE.format('''
<form id="searchGadget_form" action="/Plone/@@search"><input name="SearchableText" value="">
  <input type="submit" name="search" value="Search"></form>
<form class="rowlike enableUnloadProtection" action="http://127.0.0.1:8080/Plone/editing/doc-01/@@edit"
      method="post" enctype="multipart/form-data">
  <input type="text" name="form.widgets.IDublinCore.title" value="Page &amp; one">
  <textarea name="form.widgets.IDublinCore.description">
A page.</textarea>
  <textarea name="form.widgets.IRichTextBehavior.text">&lt;p&gt;Some text&lt;/p&gt;</textarea>
  <select name="form.widgets.IRichTextBehavior.text.mimeType"><option value="text/html">HTML</option>
    <option value="text/x-web-markdown">Markdown</option></select>
  <select name="form.widgets.language:list"><option value="en">English</option>
    <option value="de" selected>Deutsch</option></select>
  <select name="form.widgets.IDublinCore.subjects:list" multiple><option value="a" selected>a</option>
    <option value="b">b</option><option selected>c</option></select>
  <input type="hidden" name="form.widgets.IDublinCore.subjects-empty-marker" value="1">
  <input type="checkbox" name="form.widgets.IExcludeFromNavigation.exclude_from_nav:list" value="selected">
  <input type="checkbox" name="form.widgets.IVersionable.versioning_enabled:list" value="selected" checked>
  <input type="radio" name="form.widgets.table_of_contents" value="true">
  <input type="radio" name="form.widgets.table_of_contents" value="false" checked="checked">
  <input type="text" name="form.widgets.disabled" value="x" disabled>
  <input type="file" name="form.widgets.image">
  <input type="hidden" name="_authenticator" value="0123abcd">
  <input type="submit" name="form.buttons.save" value="Save">
  <button type="submit" name="form.buttons.cancel" value="Cancel">Cancel</button>
</form>''')


def test_the_form_is_read_as_a_browser_submits_it():
    form = loggedin.form_with(EDIT_PAGE, loggedin.SAVE_BUTTON)
    assert form.action == "http://127.0.0.1:8080/Plone/editing/doc-01/@@edit" and form.method == "post"
    assert form.buttons == {"form.buttons.save": "Save", "form.buttons.cancel": "Cancel"}
    assert form.fields == [
        ("form.widgets.IDublinCore.title", "Page & one"),
        ("form.widgets.IDublinCore.description", "A page."),  # the newline after <textarea> dropped
        ("form.widgets.IRichTextBehavior.text", "<p>Some text</p>"),
        ("form.widgets.IRichTextBehavior.text.mimeType", "text/html"),  # none selected: the first
        ("form.widgets.language:list", "de"),
        ("form.widgets.IDublinCore.subjects:list", "a"),
        ("form.widgets.IDublinCore.subjects:list", "c"),  # an option without value: its text
        ("form.widgets.IDublinCore.subjects-empty-marker", "1"),
        ("form.widgets.IVersionable.versioning_enabled:list", "selected"),
        ("form.widgets.table_of_contents", "false"),
        ("_authenticator", "0123abcd"),
    ]
    submitted = form.submission(loggedin.SAVE_BUTTON, {loggedin.TEXT_FIELD: "<p>new</p>"})
    assert (loggedin.TEXT_FIELD, "<p>new</p>") in submitted and (loggedin.TEXT_FIELD, "<p>Some text</p>") \
        not in submitted
    assert submitted[-1] == ("form.buttons.save", "Save") and ("form.buttons.cancel", "Cancel") not in submitted
    assert [f.buttons for f in loggedin.forms(EDIT_PAGE)][0] == {"search": "Search"}


def test_a_missing_button_is_named():
    form = loggedin.form_with(EDIT_PAGE, loggedin.SAVE_BUTTON)
    with pytest.raises(KeyError, match="no button 'buttons.login' in the form \\(buttons: form.buttons.save, "
                                       "form.buttons.cancel\\)"):
        form.submission(loggedin.LOGIN_BUTTON)
    assert loggedin.form_with(EDIT_PAGE, loggedin.LOGIN_BUTTON) is None


@pytest.mark.parametrize("page, reason", [
    ("plain text", "not an HTML page"),
    ('<html><a id="personaltools-login">Log in</a></html>', "not logged in as editor1: no log-out link"),
    (LOGGED_IN_PAGE.format("<p>no form</p>"), "no form with the button form.buttons.save"),
    (EDIT_PAGE.replace('name="_authenticator"', 'name="other"'), "the edit form lacks _authenticator"),
    (EDIT_PAGE.replace('IRichTextBehavior.text"', 'x"'), "the edit form lacks form.widgets.IRichTextBehavior.text"),
])
def test_edit_form_failures_are_named(page, reason):
    form, found = loggedin.edit_form(page, "editor1")
    assert found.startswith(reason), found


def test_a_good_edit_form_passes():
    form, reason = loggedin.edit_form(EDIT_PAGE, "editor1")
    assert reason is None and form.value("_authenticator") == "0123abcd"


def test_folder_contents_needs_the_listing():
    assert loggedin.not_folder_contents(LOGGED_IN_PAGE.format('<div class="pat-structure"></div>'), "editor1") is None
    assert loggedin.not_folder_contents(LOGGED_IN_PAGE.format(""), "editor1") == \
        "no folder listing (pat-structure) in the page"


def test_the_page_must_name_the_user():
    assert loggedin.not_logged_in(LOGGED_IN_PAGE.format(""), "editor1") is None
    assert loggedin.not_logged_in(LOGGED_IN_PAGE.format(""), "editor10") == \
        "logged in, but not as editor10: the user id is not in the page"


def test_each_save_replaces_the_last_edit_paragraph():
    once = loggedin.edited_text("<p>Some text</p>", "editor<1>", "aaaa")
    twice = loggedin.edited_text(once, "editor1", "bbbb")
    assert once == '<p>Some text</p>\n<p class="loadtest-edit">Edited by editor&lt;1&gt; in the logged-in ' \
                   'load test, mark aaaa</p>'
    assert twice.startswith("<p>Some text</p>\n") and twice.count("loadtest-edit") == 1 and "mark bbbb" in twice
    assert loggedin.not_saved(LOGGED_IN_PAGE.format(twice), "editor1", "bbbb") is None
    assert loggedin.not_saved(LOGGED_IN_PAGE.format(once), "editor1", "bbbb") == \
        "the saved text is not on the page"
    assert loggedin.not_saved(EDIT_PAGE, "editor1", "bbbb").startswith("the save answered with the edit form")


def test_simultaneous_editors_get_documents_of_their_own():
    pairs = [loggedin.assignment(i) for i in range(loggedin.DOCUMENTS)]
    assert len({doc for _, doc in pairs}) == loggedin.DOCUMENTS
    assert pairs[0] == ("editor1", "/Plone/editing/doc-01") and pairs[11] == ("editor2", "/Plone/editing/doc-12")
    assert loggedin.assignment(loggedin.DOCUMENTS) == ("editor1", "/Plone/editing/doc-01")
    with pytest.raises(ValueError, match="editor index -1 is negative"):
        loggedin.assignment(-1)


def test_the_site_script_makes_what_the_shape_uses():
    """loggedin.py is deployed without the site script (load generators): its copy of the
    counts and the folder must be the script's."""
    tree = ast.parse(open(os.path.join(ROOT, "scripts", "create_site.py"), encoding="utf-8").read())
    constants = {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant)}
    assert (constants["EDITORS"], constants["DOCUMENTS"]) == (loggedin.EDITORS, loggedin.DOCUMENTS)
    assert f"/{constants['SITE_ID']}/{constants['EDIT_FOLDER_ID']}" == loggedin.EDIT_FOLDER


def test_the_shape_is_opt_in():
    assert parse_weights(DEFAULT_WEIGHTS)["logged-in"] == 0
    assert parse_weights("logged-in=2") == {"root": 0, "plone": 0, "json": 0, "blob": 0, "logged-in": 2}


def test_ab_refuses_the_shape_without_the_password(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("PLONEDEPLOY_EDITOR_PASSWORD", raising=False)
    monkeypatch.setattr(stack_module, "EDITOR_PASSWORD_FILE", str(tmp_path / "editor-password"))
    with pytest.raises(SystemExit) as exc:
        abtest.parse_args(["--weights", "root=1,logged-in=1"])
    assert exc.value.code == 2
    assert f"--weights root=1,logged-in=1: the logged-in shape needs the editors' password, " \
           f"$PLONEDEPLOY_EDITOR_PASSWORD or {tmp_path}/editor-password" in capsys.readouterr().err
    (tmp_path / "editor-password").write_text("secret\n")
    assert abtest.parse_args(["--weights", "root=1,logged-in=1"]).weights == "root=1,logged-in=1"
    abtest.parse_args(["--weights", "root=1"])  # the other shapes need no password


def _run(kind, shares):
    """A rounds run with one window per (A, B) count pair of each path in ``shares``."""
    windows = []
    for i in range(len(next(iter(shares.values())))):
        servers = {"sa": {}, "sb": {}}
        for path, pairs in shares.items():
            for server, n in zip(("sa", "sb"), pairs[i]):
                servers[server][path] = {"n": n, "failures": 0, "p50_ms": 10, "p99_ms": 20}
        windows.append({"start_s": 5 * i, "servers": servers})
    return {"kind": kind, "round": 1, "labels": {"A": "sa", "B": "sb"}, "slot_names": {"a": "sa", "b": "sb"},
            "windows": windows, "server_time_windows": [], "warnings": []}


def test_the_ab_judges_the_logged_in_class_only_when_it_ran():
    meta = {"control": False, "name_a": "pyruvate", "name_b": "waitress"}
    plain = {"/": [(10, 10)] * 4, "all": [(10, 10)] * 4}
    verdicts = abstats.rounds_report(meta, [_run("ab", plain)])["verdicts"]
    assert [v["path"] for v in verdicts if "measure" not in v] == ["/", "/Plone", "@json", "blob 5MB", "all"]
    # pyruvate finishes 3 of every 4 logged-in requests in every window: detected
    with_editors = dict(plain, **{loggedin.LOGGED_IN: [(30, 10), (31, 10), (29, 10), (30, 11)]})
    verdicts = abstats.rounds_report(meta, [_run("ab", with_editors)])["verdicts"]
    shares = {v["path"]: v for v in verdicts if "measure" not in v}
    assert list(shares) == ["/", "/Plone", "@json", "blob 5MB", "logged-in", "all"]
    assert shares["logged-in"]["detected"] and "pyruvate finishes 74." in shares["logged-in"]["text"]


def test_headline_plans_the_logged_in_class_on_every_target_but_the_variants():
    assert {p for _, _, p in headline.plan(1, with_off=True)} == set(PATHS)
    todo = headline.plan(2, with_off=True, variant_names=("copy",), paths=(*PATHS, loggedin.LOGGED_IN))
    assert {t for _, t, p in todo if p == "logged-in"} == set(headline.TARGETS + headline.OFF)
    assert len([1 for n, _, p in todo if p == "logged-in" and n == 2]) == len(headline.TARGETS + headline.OFF)


def test_headline_refuses_logged_in_without_the_password(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("PLONEDEPLOY_EDITOR_PASSWORD", raising=False)
    monkeypatch.setattr(stack_module, "EDITOR_PASSWORD_FILE", str(tmp_path / "editor-password"))
    with pytest.raises(SystemExit) as exc:
        headline.parse_args(["--logged-in"])
    assert exc.value.code == 2 and "--logged-in: the logged-in shape needs the editors' password" in \
        capsys.readouterr().err
    monkeypatch.setenv("PLONEDEPLOY_EDITOR_PASSWORD", "secret")
    assert headline.parse_args(["--logged-in"]).logged_in


def test_a_locust_run_becomes_a_figure_row():
    """Both servers' requests together; percentiles from the merged histograms; failed checks are errors."""
    per_server = {"elapsed_s": 10.0, "server_totals": {
        "instance": {"num_requests": 30, "num_failures": 1, "total_bytes": 3 * 2**20,
                     "response_times": {"10": 20, "100": 10}},
        "client2": {"num_requests": 70, "num_failures": 0, "total_bytes": 7 * 2**20,
                    "response_times": {"20": 69, "300": 1}}}}
    assert row_of(per_server) == {"requests": 100, "rps": 10.0, "mib_s": 1.0, "p50_ms": 20, "p95_ms": 100,
                                  "p99_ms": 300, "max_ms": 300, "errors": 1}


def test_headline_reports_the_logged_in_class_with_its_ratios():
    runs = [{"round": n, "target": t, "path": p, "rps": rps, "p50_ms": 50.0, "p99_ms": 90.0, "errors": 0}
            for n, t, p, rps in [(1, "pyruvate", "/", 300), (1, "waitress", "/", 150),
                                 (1, "pyruvate", "logged-in", 20), (1, "waitress", "logged-in", 16),
                                 (1, "pyruvate-off", "logged-in", 10), (1, "waitress-off", "logged-in", 8)]]
    cells, ratios = headline.summarize(runs)
    assert ratios["pyruvate/waitress logged-in"]["median"] == 1.25
    assert ratios["pyruvate kit/stock logged-in"]["median"] == 2.0
    # the kit's default client against the nearest to a hand-built one (waitress, stock pipeline)
    assert ratios["kit/hand-built logged-in"]["median"] == 2.5 and "kit/hand-built /" not in ratios
    text = headline.to_markdown({"started": "s", "command": "c", "rounds": 1, "duration_s": 8, "connections": 4,
                                 "cores": 2, "load_before": [0.1], "load_after": [0.2], "minutes": 1.0,
                                 "clients": {"pyruvate": "instance", "waitress": "client2"}}, cells, ratios)
    assert "| logged-in | 20 (20–20) | 16 (16–16) | 10 (10–10) |" in text
    assert "logged-in: Locust's logged-in shape (4 editors" in text
    assert "| /Plone |" not in text  # paths not measured have no row


@pytest.fixture(scope="module")
def editors(stack):
    """The stack with the logged-in load test's editors and documents (create_site.py as
    `PLONEDEPLOY_EDITORS=on make site` runs it); the stack fixture makes a site without them."""
    made = run([os.path.join(ROOT, "bin", "instance"), "run", "scripts/create_site.py"], timeout=600, env=SITE_ENV)
    assert "site ready" in made.stdout, made.stdout
    return stack


@pytest.mark.integration
def test_the_admin_reads_the_zmi_without_a_write(editors):
    """With the editors' folder in the site, the admin's GET of /Plone/manage_main (and of
    /Plone/blob-5mb/manage_main, which acquires the same listing) is the ZMI page on every page
    client, not plone.protect's redirect to @@confirm-action. The listing sizes each item; a
    Dexterity item without Dublin Core creators adds the reader as its first creator while
    doing so (plone.app.dexterity's Ownership adapter), a write on a GET that plone.protect
    aborts, so every such GET was redirected again (scripts/create_site.py's content had none)."""
    stack = editors
    auth = admin_auth()
    for server in stack.config["servers"]:
        for path in ("/Plone/manage_main", "/Plone/blob-5mb/manage_main"):
            reply = requests.get(stack.client_urls[server] + path, auth=auth, allow_redirects=False, timeout=60)
            assert (reply.status_code, reply.headers.get("Location")) == (200, None), (server, path)
            # The listing with the editors' folder, whose row wrote.
            assert 'href="editing/manage_workspace"' in reply.text, (server, path, reply.text[:300])


@pytest.mark.integration
def test_the_headline_runs_the_class_against_a_client_directly(editors):
    """The headline's logged-in cell (run_locust_shape) against the pyruvate client itself (no
    HAProxy, no write lane): two editors' rounds counted after their logins, no failed check."""
    stack = editors
    url = stack.client_urls[next(n for n, kind in stack.kinds.items() if kind == "pyruvate")]
    row = run_locust_shape(url, "logged-in=1", 2, 4)
    assert row["requests"] >= 4 and row["errors"] == 0, row
    assert 0 < row["p50_ms"] <= row["p99_ms"], row


@pytest.mark.integration
def test_logged_in_shape_through_the_ab(editors, tmp_path):
    """The shape through the deployed HAProxy (two Locust worker processes, four editors):
    no failure in any step, every step counted by the A/B report, the path class in the
    windows, and each editor's own document saved with its text changed."""
    stack = editors
    session = admin_session()
    docs = [loggedin.assignment(i)[1] for i in range(4)]
    before = {doc: session.get(stack.frontend_url + doc, timeout=30).json()["text"]["data"] for doc in docs}
    logs = log_sizes(["haproxy.stdout", *stack.kinds])
    result = run([sys.executable, "-m", "loadtests", "ab", "--deployed", "--weights", "logged-in=1",
                  "--processes", "2", "--users", "4", "--spawn-rate", "4", "--warmup", "4", "--duration", "12",
                  "--out", str(tmp_path)], timeout=180, check=False)
    (folder,) = list(tmp_path.iterdir())
    report = json.loads((folder / "report.json").read_text())
    # No failure allowed, the page after each save included: the edge sends the writer's
    # reads to the client that wrote (haproxy.cfg.j2's cookie lb_wrote). Without that, a
    # client that had not seen the save yet served the old text (loggedin.STALE_PAGE) in
    # 3 of 8 runs of this shape on 28 Nov 2026.
    with open(folder / "locust_failures.csv", encoding="utf-8") as fp:
        failures = list(csv.DictReader(fp))
    assert not failures, f"{failures}\n{errors_since(logs)}"
    assert result.returncode in (0, 1), result.stdout[-3000:] + (folder / "locust.log").read_text()[-3000:]
    saves = report["paths"][loggedin.REQUESTS["save"]]
    assert report["totals"]["failures"] == saves["failures"] < saves["requests"]
    steps = [loggedin.REQUESTS[k] for k in ("front", "contents", "edit", "save")]
    assert all(report["paths"][name]["requests"] > 0 for name in steps), report["paths"]
    windows = json.loads((folder / "per_server.json").read_text())["windows"]
    merged = [entries for w in windows for entries in w["servers"].values() if loggedin.LOGGED_IN in entries]
    assert merged and all(e[loggedin.LOGGED_IN]["n"] == sum(e.get(s, {}).get("n", 0) for s in loggedin.CLASS_REQUESTS)
                          for e in merged)
    for doc in docs:  # the workers numbered their editors apart: each document has its own
        text = session.get(stack.frontend_url + doc, timeout=30).json()["text"]["data"]
        edited = re.search(r'class="loadtest-edit">Edited by editor\d+ .* mark \w{12}', text)
        assert text != before[doc] and edited, (doc, text[-300:])
    path = os.path.join(ROOT, "var", "editor-password")
    assert os.stat(path).st_mode & 0o777 == 0o600
    password = open(path, encoding="utf-8").read().strip()
    assert len(password) >= 32 and password not in result.stdout + (folder / "locust.log").read_text()


@pytest.mark.integration
def test_the_editors_login_probe(editors, monkeypatch):
    """login_problem, the matrix's check before it builds: editor1 logs in through the
    stack's HAProxy with the site's password; with another password the reason names it."""
    assert login_problem(editors.frontend_url.rstrip("/")) is None
    monkeypatch.setenv("PLONEDEPLOY_EDITOR_PASSWORD", "not-the-editors-password")
    assert login_problem(editors.frontend_url.rstrip("/")) == \
        "not logged in as editor1: no log-out link (id=\"personaltools-logout\") in the page"


#: Ports of the matrix's client in the test below (Zope, hello), apart from test_matrix.py's.
MATRIX_PORTS = (9550, 9551)


@pytest.mark.integration
def test_the_matrix_measures_the_logged_in_path(editors, tmp_path):
    """The matrix's path class logged-in on one pyruvate client of its own: Locust's editors
    after their logins, each body checked (no failure: one client, no write lane), the
    server's CPU per request counted from the end of the logins, the report's section and
    plot; then refused before anything is built when the editors cannot log in."""
    assert not [p for p in MATRIX_PORTS if port_taken(p)], f"matrix ports in use: {MATRIX_PORTS}"
    out, build = tmp_path / "reports", tmp_path / "build"
    cmd = [sys.executable, "-m", "loadtests", "matrix", "--servers", "pyruvate", "--paths", "logged-in",
           "--connections", "2", "--threads", "2", "--runs", "2", "--duration", "4", "--max-duration", "4",
           "--warmup", "2", "--base-port", str(MATRIX_PORTS[0]), "--out", str(out), "--build", str(build)]
    result = run(cmd, timeout=900, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    [folder] = list(out.iterdir())
    records = matrix_plan.load_results(str(folder / "results.jsonl"))
    assert len(records) == 2 and {r["path"] for r in records} == {"logged-in"}, records
    for r in records:
        assert r["requests"] >= 4 and r["non_2xx"] == 0 and r["rps"] > 0, r
        assert r["cpu_ms_per_req"] > 0 and r["peak_rss_bytes"] > 0 and r["p50_ms"] <= r["p99_ms"], r
    assert "## logged-in" in (folder / "report.md").read_text()
    assert (folder / "matrix-logged-in.png").stat().st_size > 0
    assert "stopped 1 servers" in result.stdout
    assert not [p for p in MATRIX_PORTS if port_taken(p)], "the matrix's client still listens"

    refused = run(cmd, timeout=120, check=False, env=dict(os.environ, PLONEDEPLOY_EDITOR_PASSWORD="wrong"))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--paths logged-in: the editors cannot log in at" in refused.stderr
    assert "PLONEDEPLOY_EDITORS=on make site" in refused.stderr and "building" not in refused.stdout
