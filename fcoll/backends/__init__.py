"""Transports: each moves contiguous buffers and does no validation or dtype policy."""
