//! Fetching models and data sets into the user cache dir, checksummed.
