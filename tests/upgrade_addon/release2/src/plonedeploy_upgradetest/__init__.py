"""plonedeploy's test add-on for ``bin/upgrade-site``, release 2: its profile at version 2,
reached from 1 by ``upgrades.count_run``."""
