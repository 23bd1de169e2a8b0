"""Launching past one machine: Cloud TPU VMs (gcloud), Ray, XPK; the supervisor and token sources."""
