"""SGLang's own output files (`/server_info` dumps, the block-accept JSONL) into run directories."""
