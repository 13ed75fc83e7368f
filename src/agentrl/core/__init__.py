"""The house's ground floor: settings, errors, logging, the episode types, API auth, the
HTTP server, supervision and small parsing helpers that every package may import (and that
import no package of agentrl above them)."""
