"""`python -m gtep.cli ...`: what a Ray Job's entrypoint and the tests run, without the installed script."""
from gtep.cli import app

app()
