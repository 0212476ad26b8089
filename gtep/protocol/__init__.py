"""The protocol core: scenarios, sampling, metrics and selection. Pure: stdlib and numpy only."""

# The families a module outside families.py defines register on import; importing them with the package
# registers them before anyone reads FAMILIES (gtep.protocol.families cannot import them: a cycle).
from gtep.protocol import cfsl_family, fluid_family, iirc_family  # noqa: E402,F401
