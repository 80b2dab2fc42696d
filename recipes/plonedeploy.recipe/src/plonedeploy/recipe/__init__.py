"""Buildout recipes of plonedeploy; see setup.py for the entry points."""
