"""The OpenAI- and Anthropic-compatible HTTP server (see app.build_app and launcher.serve)."""
