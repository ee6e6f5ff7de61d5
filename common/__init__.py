"""Facts and helpers every part of the program shares (config, planning, components, render)."""
