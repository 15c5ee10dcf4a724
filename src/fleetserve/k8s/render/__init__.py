"""fleetserve.k8s.render: fleet spec + plan -> KubeRay/HAMi/monitoring manifests (pure)."""
