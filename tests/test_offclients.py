"""loadtests.headline.offclients: the extra buildout of blob-sendfile-off clients (and their HAProxy)
that loadtests.headline.headline builds beside the stack."""
import configparser

from conftest import ROOT
from loadtests.headline import headline, offclients


def test_extra_buildout_config():
    text = offclients.buildout_config(headline.WORK_DIR, "/x/local.cfg", ["instance", "client2"],
                                      {"instance": 9183, "client2": 9184}, ("haproxy", 9185, 9186))
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read_string(text)
    assert cfg["buildout"]["extends"] == "/x/local.cfg"
    assert cfg["buildout"]["directory"] == ROOT  # the stack's blob storage and logs
    assert cfg["buildout"]["installed"].startswith(headline.WORK_DIR)  # not the stack's .installed.cfg
    assert cfg["buildout"]["parts"].split() == ["instance-off", "client2-off", "haproxy-off"]
    assert ("[instance-off]\n<= instance\nblob-sendfile = off\nhttp-address = 127.0.0.1:9183\n"
            "metrics-address =\n") in text
    assert cfg["haproxy-off"]["backends"] == "instance-off client2-off"
    assert cfg["haproxy-off"]["bind"] == "127.0.0.1:9185"
    assert cfg["haproxy-off"]["run-directory"].startswith(headline.WORK_DIR)  # own admin socket
