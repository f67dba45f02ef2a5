"""PromQL: the subset Grafana panels use, evaluated over a hub's store."""
