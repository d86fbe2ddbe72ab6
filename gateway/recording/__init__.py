"""Recording a call: token-faithful capture of ids and logprobs, and durable publishing."""
