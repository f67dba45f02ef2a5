"""Kubernetes kubelet APIs gpuscope reads (generated message classes and their provenance)."""
