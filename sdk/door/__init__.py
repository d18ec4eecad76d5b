"""The door core: one request-handling path behind both front doors.

The proxy (gateway/proxy.py: ASGI) and the drop-in SDK (sdk/dropin.py: the official clients' httpx2
transport) are thin adapters around it: each wraps its request in a `Call` (bytes in), hands it to a
`Door`, and writes the `Reply` it gets back (bytes out). What a door decides — who the team is,
which endpoint a path is, which methods it takes, the body limit, parsing, the pipeline, the error
ladder, the response headers, the request id — is decided here once, so the two cannot drift.

call.py     what an adapter hands in (`Call`), the body limit's check, `ClientGone`
keys.py     who is asking (`KeyedTeams` for team keys, `OneTeam` for the drop-in SDK)
core.py     the endpoint table and the `Door`: prepare and run a pipeline request, answer the rest
replies.py  what comes out (`Reply`) and the error ladder (`refusal`)
"""

from sdk.door.call import Call, ClientGone, Headers, too_large
from sdk.door.core import MODELS, PIPELINE, STORED, Door, allowed, protocol_for
from sdk.door.keys import KeyedTeams, OneTeam, Teams
from sdk.door.replies import Reply, refusal

__all__ = [
    "MODELS",
    "PIPELINE",
    "STORED",
    "Call",
    "ClientGone",
    "Door",
    "Headers",
    "KeyedTeams",
    "OneTeam",
    "Reply",
    "Teams",
    "allowed",
    "protocol_for",
    "refusal",
    "too_large",
]
