"""Harness adaptation: tool-call traces -> LoRA fine-tune -> a registered model."""
