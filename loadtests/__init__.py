"""Load tests and the A/B report of plonedeploy (run the CLIs with python -m loadtests.<name>)."""
