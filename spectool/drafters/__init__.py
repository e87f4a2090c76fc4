"""What proposes tokens for the target to verify: prompt lookup, a draft model, MTP heads,
hybrids."""
