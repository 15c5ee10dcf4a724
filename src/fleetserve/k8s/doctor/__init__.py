"""fleetserve.k8s.doctor: find known traps in Ray/KubeRay/vLLM/HAMi manifests before deploy."""
