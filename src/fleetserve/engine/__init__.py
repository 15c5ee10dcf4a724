"""Inference engines behind one Protocol (:mod:`fleetserve.engine.protocol`).

``VllmEngine`` is the real one (vLLM's AsyncLLM plus vLLM's own OpenAI server layer);
``FakeEngine`` speaks the same OpenAI HTTP surface without a model, for fast tests of the
serving stack. Both are driven through :class:`~fleetserve.engine.asgi_bridge.AsgiBridge`.
"""
