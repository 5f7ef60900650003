"""The head atlas: every analysis joined per head, agreement between methods, cross-model figures."""
