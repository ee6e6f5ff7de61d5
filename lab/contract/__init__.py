"""The contract harness: real llama.cpp servers and routers started, asked and stopped; the GGUFs, Hub and
router stand-ins they are tested with (docs/contract-tests.md)."""
