"""plonedeploy: deployment kit for Plone on pyruvate behind HAProxy."""
