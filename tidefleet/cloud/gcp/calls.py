"""How long a call to a Google API may take: every google-cloud client call of the adapters
passes `timeout=TRY_S` and one of the two retries below (the AWS side's `CLIENT_CONFIG`).

The libraries' defaults read for 60 s (Pub/Sub, Firestore), 300 s (Firestore batchGet) or 600 s
(Compute Engine) before a try gives up, and over REST never try again after silence (their retry
predicates name gRPC codes; requests raises its own ReadTimeout), so an endpoint that takes the
connection and never answers held the agent, the scaler and the CLI for one to ten minutes.
Here a try gives up after TRY_S of silence and no new try starts after RETRY_FOR_S: a silent
endpoint gets three tries and is reported within ~25 s. The timeout is the whole call's, each
try getting what is left of it, or all of it again once less than 1 s is left (api_core's
TimeToDeadlineTimeout). A Pub/Sub pull waits on purpose and passes its own timeout.
"""

from __future__ import annotations

import requests
from google.api_core import exceptions as gexc
from google.api_core.retry import Retry, if_exception_type

TRY_S = 8.0  # Google answers every call tidefleet makes in well under a second
RETRY_FOR_S = 20.0
# The server did not do it: any call may be made again.
REFUSED = (gexc.ServiceUnavailable, gexc.TooManyRequests)
# It may have been done, its answer lost: made again only where doing it twice changes nothing. A
# refused connection or an unknown host is not tried again: nothing there will answer in seconds.
UNANSWERED = (gexc.InternalServerError, gexc.GatewayTimeout, requests.Timeout)

# Reads, deletes, unconditional writes, a group's resize (a size, not a change), acks, and publishes
# (Pub/Sub delivers at least once anyway).
RETRY = Retry(if_exception_type(*REFUSED, *UNANSWERED), initial=0.5, maximum=4.0, multiplier=2.0, timeout=RETRY_FOR_S)
# Writes with a precondition (a create, an update-time check): made again after a lost answer, one
# that landed would fail its own precondition and read as a lost race. And deleteInstances, which
# lowers the group's target with each instance it deletes: the next tick reads the group again.
# A Pub/Sub pull too: its timeout is its wait, not a failure.
RETRY_REFUSED = RETRY.with_predicate(if_exception_type(*REFUSED))
