"""The monitoring role's alert rules: valid for promtool, and each one fires on the series
it is meant for and stays quiet on a healthy stack (``promtool test rules``).

The rules are rendered from ansible/roles/monitoring/templates/alerts.yml.j2 with the
role's defaults, as the role writes them. Needs Debian's ``prometheus`` package (promtool).
"""
import json
import os
import shutil
import subprocess

import jinja2
import pytest

from conftest import ROOT

ROLE = os.path.join(ROOT, "ansible", "roles", "monitoring")
ANSIBLE_PYTHON = os.path.join(ROOT, "ansible", ".venv", "bin", "python")

# promtool comes with Debian's prometheus package (scripts/install-system.sh, make test):
# a missing one is a failure, not a skip.
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def defaults():
    """The role's defaults/main.yml (read with the Ansible venv's PyYAML)."""
    code = "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))"
    out = subprocess.run([ANSIBLE_PYTHON, "-c", code, os.path.join(ROLE, "defaults", "main.yml")],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return json.loads(out)


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROLE, "templates")),
                             undefined=jinja2.StrictUndefined)
    text = env.get_template("alerts.yml.j2").render(ansible_managed="test", **defaults())
    path = tmp_path_factory.mktemp("rules") / "alerts.yml"
    path.write_text(text)
    return path


def test_promtool_check_rules(rules):
    result = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout, result.stdout


#: The class of Plone's uid counter, on which the ZODBConflictRate case below has conflicts.
UID_CLASS = "Products.CMFUid.UniqueIdGeneratorTool.UniqueIdGeneratorTool"

# Synthetic series, one sample per minute ("a+bxN": a, a+b, ... N+1 samples); each alert is
# checked where it must fire and where it must not (a healthy twin series, or too early).
RULE_TESTS = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'haproxy_server_status{{proxy="zeoclients",server="instance",state="DOWN"}}'
        values: '1x10'
      - series: 'haproxy_server_status{{proxy="zeoclients",server="client2",state="DOWN"}}'
        values: '0x10'
      - series: 'haproxy_backend_current_queue{{proxy="zeoclients"}}'
        values: '0 3 3 3 0x6'
      - series: 'haproxy_backend_current_queue{{proxy="uploads"}}'
        values: '0 2 0 2 0 2 0x4'
      # 10 answers a second, 1 of them 5xx (10 %) on "main"; 0 5xx on "stats".
      - series: 'haproxy_frontend_http_responses_total{{proxy="main",code="2xx"}}'
        values: '0+540x10'
      - series: 'haproxy_frontend_http_responses_total{{proxy="main",code="5xx"}}'
        values: '0+60x10'
      - series: 'haproxy_frontend_http_responses_total{{proxy="stats",code="2xx"}}'
        values: '0+600x10'
      - series: 'haproxy_frontend_http_responses_total{{proxy="stats",code="5xx"}}'
        values: '0x10'
      - series: 'node_filesystem_size_bytes{{instance="n",mountpoint="/",fstype="ext4"}}'
        values: '100x10'
      - series: 'node_filesystem_avail_bytes{{instance="n",mountpoint="/",fstype="ext4"}}'
        values: '10x10'
      - series: 'node_filesystem_size_bytes{{instance="n",mountpoint="/srv",fstype="ext4"}}'
        values: '100x10'
      - series: 'node_filesystem_avail_bytes{{instance="n",mountpoint="/srv",fstype="ext4"}}'
        values: '50x10'
      - series: 'node_filesystem_size_bytes{{instance="n",mountpoint="/run",fstype="tmpfs"}}'
        values: '100x10'
      - series: 'node_filesystem_avail_bytes{{instance="n",mountpoint="/run",fstype="tmpfs"}}'
        values: '1x10'
      # 30 conflicts a minute on the uid counter of one client from minute 2 on; 2 a minute
      # on a bucket; another client's counter stays flat.
      - series: 'zodb_conflicts_total{{job="zeoclients",instance="127.0.0.1:8091",class="{uid_class}"}}'
        values: '0 0 0+30x20'
      - series: 'zodb_conflicts_total{{job="zeoclients",instance="127.0.0.1:8091",class="BTrees.OOBTree.OOBucket"}}'
        values: '0+2x22'
      - series: 'zodb_conflicts_total{{job="zeoclients",instance="127.0.0.1:8092",class="BTrees.OOBTree.OOBucket"}}'
        values: '5x22'
      - series: 'up{{job="zeoclients",instance="127.0.0.1:8091"}}'
        values: '0x10'
      - series: 'up{{job="zeoclients",instance="127.0.0.1:8092"}}'
        values: '1x10'
      # the blackbox exporter's probes: the site fails from minute 2 to 5 and answers again;
      # another URL fails for 30 s only (a blip, two scrapes); one certificate ends in 10
      # days, the other in 60 (probe_ssl_earliest_cert_expiry is a Unix time; the test's
      # clock starts at 0).
      - series: 'probe_success{{job="blackbox",instance="https://www.example.org/Plone/@@ok"}}'
        values: '1 1 0 0 0 0 1x10'
      - series: 'probe_success{{job="blackbox",instance="https://blip.example.org/Plone/@@ok"}}'
        values: '1 1 0 1x10'
      - series: 'probe_ssl_earliest_cert_expiry{{job="blackbox",instance="https://www.example.org/Plone/@@ok"}}'
        values: '864000x30'
      - series: 'probe_ssl_earliest_cert_expiry{{job="blackbox",instance="https://blip.example.org/Plone/@@ok"}}'
        values: '5184000x30'
      # the memory watchdog: one client in its backoff from minute 2 on; the upload lane's
      # client (no peer) above its limit for one minute only
      - series: 'plonedeploy_memory_recycle_blocked{{job="zeoclients",instance="127.0.0.1:8091",reason="backoff"}}'
        values: '0 0 1x10'
      - series: 'plonedeploy_memory_recycle_blocked{{job="zeoclients",instance="127.0.0.1:8093",reason="no_peer"}}'
        values: '0 0 1 0x10'
    alert_rule_test:
      - {{eval_time: 30s, alertname: HAProxyServerDown, exp_alerts: []}}
      - eval_time: 2m
        alertname: HAProxyServerDown
        exp_alerts:
          - exp_labels: {{severity: critical, proxy: zeoclients, server: instance, state: DOWN}}
            exp_annotations: {{summary: "HAProxy server zeoclients/instance is DOWN"}}
      # queued 1m..3m on zeoclients: fires at 2m and 3m; "uploads" never queues a minute on end.
      - {{eval_time: 1m, alertname: HAProxyQueueing, exp_alerts: []}}
      - eval_time: 3m
        alertname: HAProxyQueueing
        exp_alerts:
          - exp_labels: {{severity: warning, proxy: zeoclients}}
            exp_annotations: {{summary: "3 requests queued in HAProxy backend zeoclients"}}
      - {{eval_time: 5m, alertname: HAProxyQueueing, exp_alerts: []}}
      - {{eval_time: 3m, alertname: HTTP5xxRate, exp_alerts: []}}
      - eval_time: 10m
        alertname: HTTP5xxRate
        exp_alerts:
          - exp_labels: {{severity: critical, proxy: main}}
            exp_annotations: {{summary: "10% of the answers of main are 5xx"}}
      - eval_time: 10m
        alertname: DiskAlmostFull
        exp_alerts:
          - exp_labels: {{severity: warning, instance: n, mountpoint: /, fstype: ext4}}
            exp_annotations: {{summary: "n / is 90% full"}}
      - eval_time: 3m
        alertname: ScrapeTargetDown
        exp_alerts:
          - exp_labels: {{severity: critical, job: zeoclients, instance: "127.0.0.1:8091"}}
            exp_annotations: {{summary: "zeoclients target 127.0.0.1:8091 does not answer"}}
      # the rate is above 10 a minute from about minute 3 on; 10 minutes later it fires
      - {{eval_time: 10m, alertname: ZODBConflictRate, exp_alerts: []}}
      - eval_time: 16m
        alertname: ZODBConflictRate
        exp_alerts:
          - exp_labels: {{severity: warning, job: zeoclients, instance: "127.0.0.1:8091",
                         class: {uid_class}}}
            exp_annotations:
              summary: "30.0 ConflictErrors a minute on 127.0.0.1:8091, class {uid_class}"
      - {{eval_time: 3m, alertname: ZopeClientMemoryNotRecycled, exp_alerts: []}}
      - eval_time: 5m
        alertname: ZopeClientMemoryNotRecycled
        exp_alerts:
          - exp_labels: {{severity: warning, job: zeoclients, instance: "127.0.0.1:8091", reason: backoff}}
            exp_annotations: {{summary: "127.0.0.1:8091 stays above its memory-limit and is not recycled (backoff)"}}
      # down from 2m: pending at 2m, firing from 3m (monitoring_site_down_for 1m), resolved at
      # 6m; the blip (down at 2m only) never fires
      - {{eval_time: 2m, alertname: SiteDown, exp_alerts: []}}
      - eval_time: 3m
        alertname: SiteDown
        exp_alerts:
          - exp_labels: {{severity: critical, job: blackbox, instance: "https://www.example.org/Plone/@@ok"}}
            exp_annotations: {{summary: "https://www.example.org/Plone/@@ok does not answer 2xx over https"}}
      - {{eval_time: 6m, alertname: SiteDown, exp_alerts: []}}
      # 10 days left (< 14): fires after its 10 minutes; the 60-day certificate never
      - {{eval_time: 5m, alertname: CertificateExpiresSoon, exp_alerts: []}}
      - eval_time: 10m
        alertname: CertificateExpiresSoon
        exp_alerts:
          - exp_labels: {{severity: warning, job: blackbox, instance: "https://www.example.org/Plone/@@ok"}}
            exp_annotations:
              summary: "The certificate of https://www.example.org/Plone/@@ok expires in 9d 23h 50m 0s"
"""


def test_each_alert_fires_only_when_it_should(rules, tmp_path):
    tests = tmp_path / "alerts_test.yml"
    tests.write_text(RULE_TESTS.format(rules=rules, uid_class=UID_CLASS))
    result = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
