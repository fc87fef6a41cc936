"""The base layer: what every other layer of core may use, and which uses none.

Logging, text helpers, deprecation, platforms, the process runtime (its state
and fork hook), registration handles, torch's private surfaces and the
bounded caches. Imports nothing of core above it (``.importlinter``).
"""
