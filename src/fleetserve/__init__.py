"""fleetserve: serve many LLMs on a shared GPU fleet with Ray Serve, vLLM, KubeRay and HAMi."""

__version__ = "0.1.0"
