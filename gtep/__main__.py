"""`python -m gtep ...`: the `gtep` command, for an environment whose scripts folder is not on the PATH."""
from gtep.cli import app

app(prog_name="gtep")
