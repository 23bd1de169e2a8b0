"""Cluster-scale models that train nothing: the goodput simulator and the bandwidth model."""
