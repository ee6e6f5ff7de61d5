"""inference-plane's components: one ComponentResource per module."""
