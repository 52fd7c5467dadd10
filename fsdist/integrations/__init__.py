"""Glue between fsdist and the frameworks that own the LM head's weight.

One module per framework, each importing its framework lazily (an optional extra), so that
``import fsdist`` never needs any of them. See docs/integration.md.
"""
