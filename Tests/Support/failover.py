"""Several Gatehouse instances through a PostgreSQL failover, measured: the load of a mobile app's
users (sealed sessions refreshing, relayed calls, sign-outs) on two instances while Patroni moves
the primary (a planned switchover, or the primary killed), then what the failover cost.

    phase = FailoverPhase(urls, sign_in)             # sign_in(instance) -> (app, pair)
    phase.prepare(40)                               # 40 sessions, signed in on the instances in turn
    figures = phase.run(event=lambda: stack.switchover())   # 2 sign-outs before the event, 2 during it

`figures` (JSON-able):
- sessions_lost: sessions whose latest refresh token (the last one the app received) is refused
  after the failover, or was refused during it;
- revocations_undone: sign-outs answered 200 that no longer hold (a refresh or a relayed call
  of the session succeeds after the failover);
- replays_accepted: refresh tokens the app had already exchanged (and saw replaced) that the store
  exchanges again for a new pair after the failover;
- per instance and per kind (refresh, relay): seconds from the event to the first success of a
  request sent after it, the answers in between (by status; 0: no answer), and the longest time
  without a successful answer from the event on;
- unexpected: answers that must never be (a 500, a 503 without Retry-After).
"""

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import requests


class Session:
    def __init__(self, app, pair, home):
        self.app = app
        self.chain = [pair]  # every pair the app received, in order
        self.home = home
        self.lost = False
        self.revoked = False

    @property
    def pair(self):
        return self.chain[-1]


class FailoverPhase:
    def __init__(self, urls, sign_in, relay_path="/api/storm/x"):
        self.urls = urls
        self.sign_in = sign_in
        self.relay_path = relay_path
        self.answers = []  # (sent, answered, instance, kind, status, retry_after), monotonic seconds
        self.lock = threading.Lock()
        self.sessions = []

    # The load.

    def prepare(self, count):
        with ThreadPoolExecutor(max_workers=4) as pool:
            made = list(pool.map(lambda index: (index % len(self.urls), *self.sign_in(index % len(self.urls))), range(count)))
        self.sessions = [Session(app, pair, home) for home, app, pair in made]

    def record(self, sent, instance, kind, response):
        status = response.status_code if response is not None else 0
        retry_after = response.headers.get("Retry-After") if response is not None else None
        with self.lock:
            self.answers.append((sent, time.monotonic(), instance, kind, status, retry_after))

    def exchange(self, instance, session, refresh_token):
        """POST /oauth/token with `refresh_token` of `session`'s app (not recorded)."""
        return requests.post(f"{self.urls[instance]}/oauth/token", timeout=15, data={
            "grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": session.app.client_id})

    def call(self, instance, access_token):
        """A relayed call with `access_token` (not recorded)."""
        return requests.get(self.urls[instance] + self.relay_path, timeout=15, headers={"Authorization": "Bearer " + access_token})

    def refresh(self, session, instance):
        sent = time.monotonic()
        try:
            response = self.exchange(instance, session, session.pair["refresh_token"])
        except requests.RequestException:
            response = None
        self.record(sent, instance, "refresh", response)
        if response is not None and response.status_code == 200:
            session.chain.append(response.json())
            session.app._remember(session.pair["access_token"], session.pair["refresh_token"], kind="Gatehouse token")
        elif response is not None and response.status_code == 400:
            session.lost = True
        return response

    def relay(self, session, instance):
        sent = time.monotonic()
        try:
            response = self.call(instance, session.pair["access_token"])
        except requests.RequestException:
            response = None
        self.record(sent, instance, "relay", response)
        return response

    def revoke(self, session):
        instance = 1 - session.home if len(self.urls) > 1 else 0
        for _ in range(40):  # a sign-out the app retries until it is answered
            response = requests.post(f"{self.urls[instance]}/oauth/revoke", timeout=15, data={
                "token": session.pair["refresh_token"], "token_type_hint": "refresh_token", "client_id": session.app.client_id})
            if response.status_code == 200:
                session.revoked = True
                return
            time.sleep(0.25)
        raise AssertionError(f"a sign-out was never answered 200: {response.status_code} {response.text[:200]}")

    def run(self, event, revoke_before=2, revoke_during=2, settle=2.0, deadline=90.0):
        """Load on every instance; `revoke_before` sign-outs, then `revoke_during` more just as
        `event()` starts (the failover; it returns once a new primary takes writes); the load goes on
        until every instance has answered a refresh and a relayed call sent after the event
        successfully, and `settle` seconds past the event's end."""
        live = [s for s in self.sessions if not s.revoked]
        for session in live[:revoke_before]:
            self.revoke(session)
        stop = threading.Event()
        live = [s for s in self.sessions if not s.revoked]
        during = live[:revoke_during]
        loaded = live[revoke_during:]
        workers = 8
        shares = [loaded[i::workers] for i in range(workers)]

        def refresher(share, offset):
            turn = offset
            while not stop.is_set():
                for session in share:
                    if stop.is_set():
                        return
                    if session.lost:
                        continue
                    self.refresh(session, turn % len(self.urls))
                    turn += 1

        def relayer(instance):
            turn = 0
            while not stop.is_set():
                session = loaded[turn % len(loaded)]
                turn += 1
                if not session.lost:
                    self.relay(session, instance)

        threads = [threading.Thread(target=refresher, args=(share, index), daemon=True) for index, share in enumerate(shares)]
        threads += [threading.Thread(target=relayer, args=(instance,), daemon=True) for instance in range(len(self.urls))]
        for thread in threads:
            thread.start()
        try:
            # Every loaded session rotated once before the event: the app holds a refresh token it saw replace another.
            until = time.monotonic() + 60
            while any(len(s.chain) < 2 and not s.lost for s in loaded):
                assert time.monotonic() < until, "the load never refreshed every session before the event"
                time.sleep(0.05)
            revokers = [threading.Thread(target=self.revoke, args=(session,)) for session in during]
            t0 = time.monotonic()
            for revoker in revokers:
                revoker.start()
            event()
            event_done = time.monotonic()
            for revoker in revokers:
                revoker.join(deadline)
            while True:
                recovered = self.recovery(t0)
                if all(entry["first_success_s"] is not None for entry in recovered.values()) and \
                        time.monotonic() >= max(event_done, t0 + max(e["first_success_s"] for e in recovered.values())) + settle:
                    break
                assert time.monotonic() < t0 + deadline, f"no success on every instance {deadline} s after the event: {recovered}"
                time.sleep(0.05)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        return self.figures(t0, event_done)

    # The figures.

    def recovery(self, t0):
        result = {}
        with self.lock:
            answers = list(self.answers)
        for instance in range(len(self.urls)):
            for kind in ("refresh", "relay"):
                # Requests sent after the event: the first answered 200, and the answers before it.
                after = sorted((a for a in answers if a[0] >= t0 and a[2] == instance and a[3] == kind), key=lambda a: a[1])
                first = next((a for a in after if a[4] == 200), None)
                before_first = [a[4] for a in after if first is None or a[1] < first[1]]
                # The longest time this instance answered this kind with no success, from the event on.
                successes = sorted(a[1] for a in answers if a[1] >= t0 and a[2] == instance and a[3] == kind and a[4] == 200)
                moments = [t0] + successes
                result[f"{kind}@{instance}"] = {
                    "first_success_s": round(first[1] - t0, 3) if first else None,
                    "longest_without_success_s": round(max(b - a for a, b in zip(moments, moments[1:])), 3) if successes else None,
                    "answers_before": dict(Counter(str(status) for status in before_first)),
                }
        return result

    def after_the_failover(self, action):
        """`action()` until its answer is not a 503 (the store may still be moving)."""
        for _ in range(120):
            response = action()
            if response is not None and response.status_code != 503:
                return response
            time.sleep(0.25)
        raise AssertionError("still 503 long after the failover")

    def figures(self, t0, event_done):
        # Sessions: the latest refresh token the app holds still works (on each instance in turn).
        lost = [s for s in self.sessions if s.lost and not s.revoked]
        for session in self.sessions:
            if session.revoked or session.lost:
                continue
            answer = self.after_the_failover(lambda: self.refresh(session, 0))
            if answer.status_code != 200:
                lost.append(session)
        # Sign-outs: nothing of a revoked session works on any instance.
        undone = 0
        for session in (s for s in self.sessions if s.revoked):
            works = False
            for instance in range(len(self.urls)):
                refresh = self.after_the_failover(lambda: self.exchange(instance, session, session.pair["refresh_token"]))
                relay = self.after_the_failover(lambda: self.call(instance, session.pair["access_token"]))
                works = works or refresh.status_code == 200 or relay.status_code == 200
            undone += works
        # Replays: a refresh token the app already exchanged and saw replaced, before the event.
        replays = 0
        for session in self.sessions:
            if session.revoked or session in lost or len(session.chain) < 3:
                continue
            spent = session.chain[-3]["refresh_token"]
            answer = self.after_the_failover(lambda: self.exchange(0, session, spent))
            if answer.status_code == 200:
                session.app._remember(answer.json()["access_token"], answer.json()["refresh_token"], kind="Gatehouse token")
                known = {pair["refresh_token"] for pair in session.chain}
                replays += answer.json()["refresh_token"] not in known
        with self.lock:
            answers = list(self.answers)
        unexpected = Counter()
        for _, _, _, kind, status, retry_after in answers:
            if status >= 500 and status != 503:
                unexpected[f"{kind} {status}"] += 1
            if status == 503 and not retry_after:
                unexpected[f"{kind} 503 without Retry-After"] += 1
        return {
            "sessions": len(self.sessions),
            "sessions_lost": len(lost),
            "revocations": sum(s.revoked for s in self.sessions),
            "revocations_undone": undone,
            "replays_checked": sum(1 for s in self.sessions if len(s.chain) >= 3),
            "replays_accepted": replays,
            "event_s": round(event_done - t0, 3),
            "recovery": self.recovery(t0),
            "answers_after_event": dict(Counter(f"{a[3]} {a[4]}" for a in answers if a[0] >= t0)),
            "unexpected": dict(unexpected),
        }
