"""Adapters between fsdist and the frameworks around it: the ones that own the LM head's
weight (Megatron-Core) and the ones that drive sampling (vLLM, a transformers decode loop).

One module per framework, each importing its framework lazily (an optional extra), so that
``import fsdist`` and ``import fsdist.integrations.<name>`` work where the framework is
absent. See docs/integration.md.
"""
