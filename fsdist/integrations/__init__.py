"""Adapters between fsdist and serving or training frameworks.

Each adapter is its own module and imports its framework lazily, so ``import
fsdist.integrations.<name>`` works (and documents itself) where the framework is absent.
"""
