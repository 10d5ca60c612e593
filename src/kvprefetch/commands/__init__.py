"""Click commands, one module per command family. Each module stays thin over the library."""
