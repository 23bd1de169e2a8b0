"""Runners of one mode each: dp, islands (diloco, streaming, decoupled), compare."""
