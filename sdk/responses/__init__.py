"""The Responses API: routing targets (native or translated), the response store, stored-response reads."""
