"""One module (or package) per simulator; ``base`` holds the protocols."""
