"""Install release 1 of the test add-on on the site, afresh; for tests/test_upgrade_site.py.

Run as ``bin/instance run tests/upgrade_addon/install.py`` with an installed release
1 on ``PYTHONPATH``, for the site ``Plone``. Installs ``plonedeploy_upgradetest`` with Plone's add-on installer, or,
when an earlier run left it installed, applies its profile again: either way the site ends
with the profile at version 1 and the record ``plonedeploy_upgradetest.upgrade_runs`` at 0.
Prints ``installed plonedeploy_upgradetest:default at version 1``; exits non-zero (Zope's
traceback) on any error.
"""
import transaction
from plone.base.utils import get_installer
from zope.component.hooks import setSite

PRODUCT = "plonedeploy_upgradetest"
PROFILE = f"{PRODUCT}:default"


def main(app, site_id):
    site = app[site_id]
    setSite(site)
    installer = get_installer(site, app.REQUEST)
    if installer.is_product_installed(PRODUCT):
        # Back to release 1's state: the import steps set the profile's version to the
        # metadata.xml on the path (1) and the record to its registry.xml value (0).
        site.portal_setup.runAllImportStepsFromProfile(f"profile-{PROFILE}")
    elif not installer.install_product(PRODUCT):
        raise RuntimeError(f"{PRODUCT} did not install: is release 1 on PYTHONPATH?")
    version = site.portal_setup.getLastVersionForProfile(PROFILE)
    transaction.get().note(f"tests/upgrade_addon/install.py: {PROFILE} at {version}")
    transaction.commit()
    print(f"installed {PROFILE} at version {'.'.join(version)}")


if "app" in globals():
    main(app, "Plone")  # noqa: F821 -- bound by bin/instance run
