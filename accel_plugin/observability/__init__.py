"""What an operator watches: KV-cache accounting, request traces and the allocator simulator, live metrics."""
