"""What every layer of the tuner shares and nothing else: atomic file writes
(:mod:`tuner.common.atomic`) and result provenance (:mod:`tuner.common.provenance`).
"""
