"""plonedeploy's test add-on for ``bin/upgrade-site``, release 1: a profile at version 1."""
