/* The native front: sockets, framing and queueing of the common infer request off the GIL.
 *
 * Why: per request, Raybatch's Python server spent ~130 us of one GIL on a binary infer
 * request (the event loop's callbacks, the parse, the engine's submit, the answer's
 * write), where Triton and mosec parse, queue and answer on native threads and enter
 * Python once per batch. This front does the same for the one request that dominates a
 * serving load, and for nothing else:
 *
 * - a thread of its own (no GIL) accepts, reads and writes every connection (epoll), and
 *   frames every request on it with llhttp (the Python server's parser, built in), once:
 *   Python never sees a connection's bytes, so no byte stream is framed by two parsers;
 * - a request it frames whole and finds plain (POST, HTTP/1.1, Content-Length framing,
 *   exactly one Host, no coding, no Expect, no Upgrade, within the header limits as the
 *   Python server counts them) whose target and binary JSON header are byte for byte
 *   those of a request the Python server already parsed cleanly (a *plan*, registered
 *   from Python: `add_plan`) is queued: its tensor bytes appended to one buffer, a token
 *   naming its connection and place (a slot is not reused while a token of it is
 *   outstanding);
 * - Python takes everything queued in one call per wake-up (`take`), submits each plan's
 *   requests to the engine as one block, and hands the answers back in one call per
 *   block (`answer_parts`, `answer_same`); they are written in each connection's order;
 * - any other request goes to Python as an event (EV_REQUEST: its method, target, headers
 *   and body): whole, or streamed (its head, then its body as it comes, EV_BODY) where its
 *   head must pass the Python server's framing checks first, it expects 100-continue, or
 *   its body is large or slow; Python answers it by the Python server's rules and hands
 *   the answer's bytes back (`write`, streamed or whole), written in the connection's
 *   order;
 * - input llhttp or a limit refuses goes to Python as a refusal (EV_REFUSED), worded as
 *   the Python server words it and answered in its turn; nothing after it is read; a head
 *   slower than header_timeout_s gets the Python server's 408 from here. What this file
 *   answers itself is only what the Python server answered the same way before.
 *
 * Locking: one mutex over everything; the front's thread never takes the GIL, and the
 * calls from Python release the GIL while they wait for the mutex and write.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "llhttp.h"

#define TAG_LISTEN 0xffffffff00000001ULL
#define TAG_WAKE 0xffffffff00000002ULL
#define NPLANS 1024 /* open addressing: at most half of it used */
#define READ_CHUNK 65536
#define LINGER_S 2.0
#define SWEEP_S 0.25
#define ACCEPT_BACKOFF_S 0.1 /* no descriptor or buffer for a new connection: wait this */

/* A token names a queued request: its slot (24 bits), the slot's generation (GEN_BITS) and
 * its place on the connection (24 bits). A slot whose connection closes with requests still
 * queued stays reserved until every one of them is answered or dropped, so no token of an
 * earlier connection can be outstanding when the slot is taken again: the generation never
 * has to be wide enough not to wrap (the tests build it 2 bits wide to show that). */
#ifndef FRONT_TOKEN_GEN_BITS
#define FRONT_TOKEN_GEN_BITS 16
#endif
#define GEN_MASK ((1u << FRONT_TOKEN_GEN_BITS) - 1)
#define SEQ_MASK 0xffffffu

enum { M_C = 0, M_LINGER = 2 };
enum { EV_EOF = 3, EV_DRAINED = 5, EV_GONE = 6, EV_REQUEST = 7, EV_BODY = 8, EV_REFUSED = 9 };
/* what a refusal is (EV_REFUSED), worded by Python as the Python server words it */
enum { NO_HEAD = 1, NO_URL = 2, NO_HEADERS = 3, NO_MALFORMED = 4 };
#define STREAM_AHEAD READ_CHUNK /* body bytes of a streamed request Python may hold unread */

typedef struct { char *p; size_t len, cap; } buf_t;

static int buf_reserve(buf_t *b, size_t more) {
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p; b->cap = cap;
    return 0;
}
static int buf_add(buf_t *b, const void *d, size_t n) {
    if (!n) return 0;  /* nothing (the end of an answer): no buffer needed */
    if (buf_reserve(b, n)) return -1;
    memcpy(b->p + b->len, d, n); b->len += n;
    return 0;
}
static void buf_free(buf_t *b) { free(b->p); b->p = NULL; b->len = b->cap = 0; }

/* An answer (or the start of one) that came before an earlier request's on its connection:
 * held until it is that answer's turn. `done`: the whole answer is here. */

typedef struct held { uint32_t seq; int done; buf_t data; struct held *next; } held_t;

typedef struct {
    int fd, mode, open;
    uint32_t gen;
    int reserved; uint32_t owed;  /* closed, its slot held until `owed` answers come */
    uint32_t gone;                /* answers dropped: they came after one that closes */
    buf_t in; size_t in_off;      /* C mode: received, not yet parsed */
    buf_t out; size_t out_off;    /* to send */
    uint32_t next_seq, write_seq; /* queued requests; answers written */
    int close_seq_set; uint32_t close_seq; /* the request that asked to close */
    held_t *held;                 /* answers that came before an earlier one's */
    size_t held_bytes;            /* ... their bytes */
    int eof, no_more, over_high, shut_after, close_after;
    int eof_owed;                 /* the client sent all it will: Python is still to be told */
    size_t need;                  /* bytes of the request being received, once its head is */
    struct stream *st;            /* the request whose body is streamed to Python, if any */
    uint32_t events;              /* what epoll watches now */
    double last_io, partial_since, linger_until;
} conn_t;

typedef struct { char *key; size_t keylen; uint64_t hash; int32_t id; uint32_t payload; int size; } plan_t;
/* size: 0 a binary request's plan (key: its JSON header); 4 or 8 a JSON request's whose
 * `data` is read as FP32 or FP64 (key: its JSON with the data list emptied) */

typedef struct { const char *name; size_t name_len; const char *value; size_t value_len; } field_t;

typedef struct {
    void *f;  /* the Front */
    const char *method; size_t method_len;
    const char *url; size_t url_len;
    const char *name; size_t name_len; const char *value; size_t value_len;
    uint32_t count; size_t bytes, head_bytes; /* header bytes (a trailer's too), the head's */
    int hosts, coded, headers_done, complete, has_json, plain, major, minor;
    int why;    /* a refusal found (NO_HEAD, NO_URL, NO_HEADERS, NO_MALFORMED) */
    const char *reason; /* llhttp's, for NO_MALFORMED */
    const char *head_end; /* where the last of the head read so far ends */
    int expect, pieces, oom;
    int odd;    /* a head the Python server's framing checks must pass first: streamed */
    int stream; /* a body the front does not frame whole: streamed */
    int te, chunked, copy;   /* Transfer-Encoding fields, `chunked` alone; copy its body */
    uint64_t json, length;
    const char *body; size_t body_len;
} rq_t;  /* its header fields are the Front's `fields` (field_t each) */

/* A request whose body goes to Python as it arrives (EV_BODY) rather than whole: a head
 * the Python server's framing checks must pass first (Expect, CONNECT, Transfer-Encoding,
 * Host, version), a body past the front's bounds, or one arriving slowly. Its own parser
 * carries on from the end of its head, which `recognise` read. */
typedef struct stream {
    llhttp_t p;
    void *f; uint32_t slot;
    uint64_t token;
    size_t unacked;  /* body bytes handed to Python, not yet taken by its app */
    size_t bytes;    /* header bytes with the trailer's counted on (the Python server's count) */
    int gate;        /* the head waits for Python's checks: `more` opens it */
    int stop;        /* an answer closes the connection: no more of the body is read */
    int in_head, done, why, oom;
} stream_t;

typedef struct ev { int kind; uint32_t slot, gen; int flag; size_t len; struct ev *next; char data[]; } ev_t;

typedef struct { uint64_t token; double t; int32_t plan; uint32_t len; } arrival_t;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_t thread;
    int started, running, lfd, ep, wake_fd, py_fd, signaled, fast_on, accepting, closing;
    conn_t *conns; uint32_t nslots, *freelist, nfree, nconn;
    /* limits */
    uint32_t max_conns, max_pipe, max_header_count, max_header_bytes, max_head, max_body;
    size_t high_water; double keep_alive_s, partial_s;
    plan_t plans[NPLANS]; uint32_t nplans;
    rq_t rq;                 /* the request being framed (the front's thread's, under mu) */
    buf_t arena, arrivals;
    ev_t *ev_head, *ev_tail;
    buf_t busy; /* the whole 503 for a connection past max_conns */
    buf_t slow_head; double header_timeout_s; /* the whole 408 for a head too slow, and when */
    buf_t chunks;            /* a chunked request's body, its pieces copied together */
    buf_t fields;            /* the header fields of the request being framed (field_t) */
    uint64_t n_fast, n_requests, n_streams, n_refusals, n_accepted, n_refused, n_loops, n_idle, n_accept_paused;
    int json_plans;
    int spare_fd;            /* held to be closed when no descriptor is left (EMFILE) */
    int accept_paused; double accept_resume;
} Front;

static double now_s(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t fnv(const char *a, size_t n, const char *b, size_t m) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)a[i]; h *= 1099511628211ULL; }
    h ^= 0xff; h *= 1099511628211ULL;
    for (size_t i = 0; i < m; i++) { h ^= (unsigned char)b[i]; h *= 1099511628211ULL; }
    return h;
}

static plan_t *find_plan(Front *f, const char *path, size_t pn, const char *hdr, size_t hn,
                         int json) {
    if (!f->nplans) return NULL;
    uint64_t h = fnv(path, pn, hdr, hn);
    for (uint32_t i = 0; i < NPLANS; i++) {
        plan_t *p = &f->plans[(h + i) % NPLANS];
        if (!p->key) return NULL;
        if (p->hash == h && p->keylen == pn + 1 + hn && !memcmp(p->key, path, pn) &&
            p->key[pn] == '\0' && !memcmp(p->key + pn + 1, hdr, hn) && (p->size != 0) == json)
            return p;
    }
    return NULL;
}

/* -- events for Python ------------------------------------------------------------------ */
static int push_ev(Front *f, int kind, uint32_t slot, uint32_t gen, int flag,
                   const char *d, size_t n) {
    ev_t *e = malloc(sizeof(ev_t) + n);
    if (!e) return -1;
    e->kind = kind; e->slot = slot; e->gen = gen; e->flag = flag; e->len = n; e->next = NULL;
    if (n) memcpy(e->data, d, n);
    if (f->ev_tail) f->ev_tail->next = e; else f->ev_head = e;
    f->ev_tail = e;
    return 0;
}

static void signal_py(Front *f) {
    if (!f->signaled && (f->ev_head || f->arrivals.len)) {
        uint64_t one = 1;
        f->signaled = 1;
        if (write(f->py_fd, &one, 8) < 0) { /* a full counter still wakes the reader */ }
    }
}

/* -- connections ------------------------------------------------------------------------ */
/* How much unparsed input a connection may hold: a head and a read's worth, or, while a
 * request whose head is framed waits for the rest of its body, that whole request. */
static size_t in_room(Front *f, conn_t *c) {
    size_t room = (size_t)f->max_head + READ_CHUNK;
    return c->need > room ? c->need : room;
}

static void watch(Front *f, uint32_t slot) {
    conn_t *c = &f->conns[slot];
    if (!c->open) return;
    uint32_t want = 0;
    int out = c->out.len > c->out_off;
    if (c->mode == M_C) {
        /* a streamed body is read on after its request's own `Connection: close` */
        int more = c->st ? !c->st->stop : !c->no_more;
        if (!c->eof && more && c->in.len - c->in_off < in_room(f, c) &&
            c->next_seq - c->write_seq < f->max_pipe && c->out.len - c->out_off <= f->high_water)
            want |= EPOLLIN;
    } else {
        want |= EPOLLIN; /* lingering: read and drop until the client closes */
    }
    if (out) want |= EPOLLOUT;
    if (want != c->events) {
        struct epoll_event ev = {.events = want, .data.u64 = ((uint64_t)c->gen << 32) | slot};
        epoll_ctl(f->ep, EPOLL_CTL_MOD, c->fd, &ev);
        c->events = want;
    }
}

/* The slot takes a new connection: its generation moves on, and no token of the last one
 * is outstanding (close_conn reserves the slot until they are answered). */
static void free_slot(Front *f, uint32_t slot) {
    conn_t *c = &f->conns[slot];
    c->reserved = 0; c->owed = 0; c->gen++;
    f->freelist[f->nfree++] = slot;
}

static void end_stream(conn_t *c) {
    free(c->st);
    c->st = NULL;
}

static void close_conn(Front *f, uint32_t slot) {
    conn_t *c = &f->conns[slot];
    if (!c->open) return;
    end_stream(c);
    epoll_ctl(f->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    buf_free(&c->in); buf_free(&c->out);
    uint32_t owed = (c->next_seq - c->write_seq) & SEQ_MASK;  /* queued, not yet written */
    owed -= c->gone;
    for (held_t *h = c->held; h;) {  /* a part of an answer still owes its end */
        held_t *n = h->next;
        owed -= h->done;
        buf_free(&h->data); free(h);
        h = n;
    }
    c->held = NULL; c->held_bytes = 0;
    c->open = 0; c->fd = -1;
    f->nconn--;
    if (owed) {  /* answers still to come: the slot waits for them */
        c->reserved = 1; c->owed = owed;
        /* Python cancels what of it the engine has not started: its tokens' common part */
        uint64_t prefix = ((uint64_t)slot << 16) | (c->gen & GEN_MASK);
        push_ev(f, EV_GONE, slot, c->gen, 0, (const char *)&prefix, sizeof prefix);
        return;
    }
    free_slot(f, slot);
}

static void linger_close(Front *f, uint32_t slot) {
    conn_t *c = &f->conns[slot];
    c->mode = M_LINGER;
    end_stream(c);
    c->shut_after = 1;
    c->linger_until = now_s() + LINGER_S;
}

static void flush(Front *f, uint32_t slot) {
    conn_t *c = &f->conns[slot];
    while (c->open && c->out.len > c->out_off) {
        ssize_t n = send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            close_conn(f, slot);
            return;
        }
        c->out_off += n;
        c->last_io = now_s();
    }
    if (!c->open) return;
    if (c->out_off == c->out.len) {
        c->out.len = c->out_off = 0;
        if (c->out.cap > 4 * READ_CHUNK) buf_free(&c->out);
        if (c->close_after) { close_conn(f, slot); return; }
        if (c->shut_after) { shutdown(c->fd, SHUT_WR); c->shut_after = 0; }
    }
    /* an answer Python streams, told to wait, may go on */
    if (c->over_high && c->out.len - c->out_off + c->held_bytes <= f->high_water / 4) {
        c->over_high = 0;
        push_ev(f, EV_DRAINED, slot, c->gen, 0, NULL, 0);
    }
    watch(f, slot);
}

static int lower_eq(const char *a, size_t n, const char *lit) {
    size_t m = strlen(lit);
    if (n != m) return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = a[i];
        if (ch >= 'A' && ch <= 'Z') ch += 32;
        if (ch != lit[i]) return 0;
    }
    return 1;
}

static int digits(const char *v, size_t n, uint64_t *out) {
    if (n == 0 || n > 9) return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9') return -1;
        x = x * 10 + (v[i] - '0');
    }
    *out = x;
    return 0;
}

/* -- JSON requests: the body with its one `data` list emptied is the plan's key ----------- */
typedef struct { const char *p, *end; int depth; const char *ds, *de; int spans; } js_t;

static void js_ws(js_t *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int js_string(js_t *j) {
    j->p++;
    while (j->p < j->end) {
        unsigned char c = *j->p++;
        if (c == '"') return 0;
        if (c < 0x20) return -1;
        if (c == '\\') {
            if (j->p >= j->end) return -1;
            c = *j->p++;
            if (c == 'u') {
                for (int i = 0; i < 4; i++, j->p++)
                    if (j->p >= j->end || !strchr("0123456789abcdefABCDEF", *j->p) || !*j->p) return -1;
            } else if (!strchr("\"\\/bfnrt", c) || !c) return -1;
        }
    }
    return -1;
}

/* A JSON number (RFC 8259's grammar); *is_int: no fraction, no exponent. */
static int js_number(js_t *j, int *is_int) {
    const char *p = j->p;
    if (p < j->end && *p == '-') p++;
    if (p >= j->end) return -1;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (p < j->end && *p >= '0' && *p <= '9') p++;
    else return -1;
    *is_int = 1;
    if (p < j->end && *p == '.') {
        p++; *is_int = 0;
        if (p >= j->end || *p < '0' || *p > '9') return -1;
        while (p < j->end && *p >= '0' && *p <= '9') p++;
    }
    if (p < j->end && (*p == 'e' || *p == 'E')) {
        p++; *is_int = 0;
        if (p < j->end && (*p == '+' || *p == '-')) p++;
        if (p >= j->end || *p < '0' || *p > '9') return -1;
        while (p < j->end && *p >= '0' && *p <= '9') p++;
    }
    j->p = p;
    return 0;
}

/* ctx: 0 any value, 1 the root, 2 the root's "inputs", 3 one input, 4 an input's "data" */
static int js_value(js_t *j, int ctx) {
    js_ws(j);
    if (j->p >= j->end) return -1;
    char c = *j->p;
    if (c == '{') {
        if (++j->depth > 32) return -1;
        j->p++; js_ws(j);
        if (j->p < j->end && *j->p == '}') { j->p++; j->depth--; return 0; }
        while (1) {
            js_ws(j);
            if (j->p >= j->end || *j->p != '"') return -1;
            const char *k = j->p;
            if (js_string(j)) return -1;
            size_t kn = j->p - k;
            /* a key with an escape may be any key once decoded ("d\u0061ta" is "data"): the
             * Python path reads such a body, so the data list is the one orjson reads */
            if (memchr(k, '\\', kn)) return -1;
            js_ws(j);
            if (j->p >= j->end || *j->p != ':') return -1;
            j->p++;
            int child = 0;
            if (ctx == 1 && kn == 8 && !memcmp(k, "\"inputs\"", 8)) child = 2;
            else if (ctx == 3 && kn == 6 && !memcmp(k, "\"data\"", 6)) child = 4;
            if (js_value(j, child)) return -1;
            js_ws(j);
            if (j->p >= j->end) return -1;
            if (*j->p == ',') { j->p++; continue; }
            if (*j->p == '}') { j->p++; j->depth--; return 0; }
            return -1;
        }
    }
    if (c == '[') {
        if (++j->depth > 32) return -1;
        j->p++;
        const char *start = j->p;
        js_ws(j);
        if (j->p < j->end && *j->p == ']') {
            if (ctx == 4) { j->ds = start; j->de = j->p; j->spans++; }
            j->p++; j->depth--; return 0;
        }
        while (1) {
            if (ctx == 4) {  /* a flat list of numbers, or not ours */
                int is_int;
                js_ws(j);
                if (js_number(j, &is_int)) return -1;
            } else if (js_value(j, ctx == 2 ? 3 : 0)) return -1;
            js_ws(j);
            if (j->p >= j->end) return -1;
            if (*j->p == ',') { j->p++; continue; }
            if (*j->p == ']') {
                if (ctx == 4) { j->ds = start; j->de = j->p; j->spans++; }
                j->p++; j->depth--; return 0;
            }
            return -1;
        }
    }
    if (ctx == 4) return -1;
    if (c == '"') return js_string(j);
    if (c == 't') { if (j->end - j->p < 4 || memcmp(j->p, "true", 4)) return -1; j->p += 4; return 0; }
    if (c == 'f') { if (j->end - j->p < 5 || memcmp(j->p, "false", 5)) return -1; j->p += 5; return 0; }
    if (c == 'n') { if (j->end - j->p < 4 || memcmp(j->p, "null", 4)) return -1; j->p += 4; return 0; }
    int is_int;
    return js_number(j, &is_int);
}

/* The body's one data list [*ds, *de) (between its brackets), or -1: not a JSON request
 * this front reads (not an object, not valid JSON, no or several data lists, a list of
 * anything but numbers). */
static int js_scan(const char *body, size_t n, const char **ds, const char **de) {
    js_t j = {body, body + n, 0, NULL, NULL, 0};
    js_ws(&j);
    if (j.p >= j.end || *j.p != '{') return -1;
    if (js_value(&j, 1)) return -1;
    js_ws(&j);
    if (j.p != j.end || j.spans != 1) return -1;
    *ds = j.ds; *de = j.de;
    return 0;
}

/* The data list's numbers as the plan's datatype into out[count]: what the Python path
 * reads without an error (integers exact to 2**53, floats within the datatype's range),
 * else -1 and the Python path answers. */
static int js_read(const char *p, const char *end, int size, char *out, uint32_t count) {
    js_t j = {p, end, 0, NULL, NULL, 0};
    uint32_t i = 0;
    char tmp[64];
    while (1) {
        js_ws(&j);
        if (j.p >= j.end) break;
        const char *t = j.p;
        int is_int;
        if (js_number(&j, &is_int) || i >= count) return -1;
        size_t tn = j.p - t;
        double d;
        if (is_int) {
            const char *q = t;
            int neg = *q == '-';
            if (neg) q++;
            if (j.p - q > 15) return -1;  /* past 2**53 maybe: the Python path */
            long long x = 0;
            for (; q < j.p; q++) x = x * 10 + (*q - '0');
            d = (double)(neg ? -x : x);
        } else {
            if (tn >= sizeof tmp) return -1;
            memcpy(tmp, t, tn); tmp[tn] = '\0';
            d = strtod(tmp, NULL);
            if (!isfinite(d)) return -1;
        }
        if (size == 4) {
            if (fabs(d) > FLT_MAX) return -1;
            float fl = (float)d;
            memcpy(out + (size_t)i * 4, &fl, 4);
        } else {
            memcpy(out + (size_t)i * 8, &d, 8);
        }
        i++;
        js_ws(&j);
        if (j.p < j.end && *j.p == ',') j.p++;
    }
    return i == count ? 0 : -1;
}

enum { R_MORE = 0, R_FAST = 1, R_REFUSE = 2, R_REQUEST = 3, R_STREAM = 4 };

/* -- framing: llhttp, as the Python server frames (httptools, the same version) -----------
 * A request is framed from the start of what is buffered by a parser of its own (llhttp
 * carries nothing from one request to the next that matters here), paused at its end. Its
 * head is read as httptools hands it to the Python server: a header is a name and the value
 * after it; headers counted and their bytes summed the same way; the URL and the header
 * bytes refused past max_header_bytes as they arrive, the head past its bound. Then:
 * - a whole request with a plan is queued for it (R_FAST);
 * - any other whole request goes to Python as one event (R_REQUEST), answered in its turn;
 * - a request whose head the Python server's framing checks must pass before its body is
 *   read (Expect, CONNECT, a Transfer-Encoding other than `chunked` alone in HTTP/1.1, a
 *   Host missing or doubled, another version), whose body is past the front's bound (over
 *   max_body_bytes, or chunked past a head's bound) or arrives slowly is streamed
 *   (R_STREAM): its head as an event, its body as it comes (EV_BODY), read ahead of the app
 *   by at most STREAM_AHEAD bytes;
 * - what the parser refuses, or a head past its bounds, is refused (R_REFUSE): an event
 *   Python words as the Python server words it, answered in its turn; nothing after it is
 *   read. */

/* The header read so far is whole (httptools' _maybe_call_on_header); -1: past the limit */
static int rq_header(rq_t *r) {
    if (!r->value) return 0;
    Front *f = r->f;
    const char *n = r->name, *v = r->value;
    size_t nn = r->name_len, vn = r->value_len;
    r->name = r->value = NULL; r->name_len = r->value_len = 0;
    r->bytes += nn + vn;
    if (r->bytes > f->max_header_bytes) { r->why = NO_HEADERS; return -1; }
    if (r->headers_done) return 0;  /* a chunked body's trailer field: counted, never used */
    r->head_end = v + vn;
    field_t fl = {n, nn, v, vn};
    if (buf_add(&f->fields, &fl, sizeof fl)) { r->oom = 1; return -1; }
    r->count++;
    if (lower_eq(n, nn, "host")) r->hosts++;
    else if (lower_eq(n, nn, "inference-header-content-length")) {
        if (r->has_json || digits(v, vn, &r->json)) r->coded = 1;
        r->has_json = 1;
    } else if (lower_eq(n, nn, "content-encoding")) {
        r->coded = 1;  /* the app decodes it: no plan's bytes */
    } else if (lower_eq(n, nn, "transfer-encoding")) {
        /* exactly `chunked` (blanks around it aside) is the front's to frame */
        while (vn && (*v == ' ' || *v == '\t')) { v++; vn--; }
        while (vn && (v[vn - 1] == ' ' || v[vn - 1] == '\t')) vn--;
        r->te++;
        r->chunked = lower_eq(v, vn, "chunked");
    } else if (lower_eq(n, nn, "expect")) {
        /* 100-continue (blanks around it aside) is served; any other, the Python server's 417 */
        while (vn && (*v == ' ' || *v == '\t')) { v++; vn--; }
        while (vn && (v[vn - 1] == ' ' || v[vn - 1] == '\t')) vn--;
        r->expect = r->expect == 2 || !lower_eq(v, vn, "100-continue") ? 2 : 1;
    }
    return 0;
}

/* A span in pieces (never within one buffer llhttp reads at once): a request this front
 * cannot hand over as the Python server reads it; refused as malformed. */
static int rq_span(rq_t *r, const char **start, size_t *len, const char *at, size_t n) {
    if (!*start) *start = at;
    if (*start + *len != at) { r->pieces = 1; return -1; }
    *len += n;
    return 0;
}

static int rq_method(llhttp_t *p, const char *at, size_t n) {
    rq_t *r = p->data;
    return rq_span(r, &r->method, &r->method_len, at, n);
}

static int rq_url(llhttp_t *p, const char *at, size_t n) {
    rq_t *r = p->data;
    if (rq_span(r, &r->url, &r->url_len, at, n)) return -1;
    r->head_end = r->url + r->url_len;
    if (r->url_len > ((Front *)r->f)->max_header_bytes) { r->why = NO_URL; return -1; }
    return 0;
}

static int rq_field(llhttp_t *p, const char *at, size_t n) {
    rq_t *r = p->data;
    if (rq_header(r)) return -1;
    return rq_span(r, &r->name, &r->name_len, at, n);
}

static int rq_value(llhttp_t *p, const char *at, size_t n) {
    rq_t *r = p->data;
    return rq_span(r, &r->value, &r->value_len, at, n);
}

static int rq_headers(llhttp_t *p) {
    rq_t *r = p->data;
    Front *f = r->f;
    if (rq_header(r)) return -1;
    r->headers_done = 1;
    r->head_bytes = r->bytes;
    r->length = p->content_length;
    r->major = p->http_major; r->minor = p->http_minor;
    int method = llhttp_get_method(p);
    /* chunked: one Transfer-Encoding field, `chunked`, in HTTP/1.1 (RFC 9112 6.1) */
    int chunked = r->te == 1 && r->chunked && p->http_minor == 1 && (p->flags & F_CHUNKED);
    r->chunked = chunked;
    r->odd = r->expect == 2 || method == HTTP_CONNECT || p->http_major != 1 || p->http_minor > 1 ||
             (!chunked && (r->te || (p->flags & (F_CHUNKED | F_TRANSFER_ENCODING)))) ||
             r->hosts > 1 || (p->http_minor == 1 && r->hosts != 1);  /* RFC 9112 3.2 */
    if (r->odd) return HPE_PAUSED;  /* its body waits for Python's checks */
    if (p->upgrade) {  /* as httptools reads it: no body, the rest another protocol's */
        r->length = 0;
        return 1;
    }
    /* a body past the bound (the app's 413), or one its client sends once told to (100) */
    if ((!chunked && r->length > f->max_body) || r->expect) r->stream = 1;
    if (r->stream) return HPE_PAUSED;
    int plain = method == HTTP_POST && p->http_minor == 1 && (p->flags & F_CONTENT_LENGTH) &&
                !r->coded && !p->upgrade && !(r->has_json && r->json > r->length) &&
                r->url_len >= 2 && r->url[0] == '/' && r->count <= f->max_header_count;
    for (size_t i = 0; plain && i < r->url_len; i++) {
        unsigned char ch = r->url[i];
        if (ch <= 0x20 || ch >= 0x7f || ch == '#' || ch == '?' || ch == '%') plain = 0;
    }
    r->plain = plain;
    return 0;
}

static int rq_body(llhttp_t *p, const char *at, size_t n) {
    rq_t *r = p->data;
    Front *f = r->f;
    if (r->chunked) {  /* pieces between chunk lines: copied together once it is whole */
        r->body_len += n;
        if (r->body_len > f->max_body) { r->stream = 1; return -1; }  /* the app's 413 */
        if (r->copy && buf_add(&f->chunks, at, n)) { r->oom = 1; return -1; }
        return 0;
    }
    return rq_span(r, &r->body, &r->body_len, at, n);
}

static int rq_complete(llhttp_t *p) {
    rq_t *r = p->data;
    if (rq_header(r)) return -1;  /* a chunked body's last trailer field */
    r->complete = 1;
    return HPE_PAUSED; /* the next request is framed on its own */
}

static llhttp_settings_t rq_settings;

/* One request at p[0..n): queued for its plan (R_FAST), whole for Python (R_REQUEST: `*r`
 * says where its parts are), streamed (R_STREAM), refused (R_REFUSE: r->why says how) or
 * incomplete (R_MORE); *used bytes. -1: no memory. */
static int recognise(Front *f, const char *p, size_t n, size_t *used, plan_t **plan,
                     int *close, const char **payload, const char **payload_end, rq_t *r,
                     size_t *need) {
    memset(r, 0, sizeof *r);
    r->f = f;
    f->fields.len = 0;
    llhttp_t parser;
    llhttp_init(&parser, HTTP_REQUEST, &rq_settings);
    parser.data = r;
    llhttp_errno_t err = llhttp_execute(&parser, p, n);
    if (r->oom) return -1;
    if (r->why) return R_REFUSE;
    if (r->head_end && (size_t)(r->head_end - p) > f->max_head) {
        r->why = NO_HEAD;  /* the Python server's bound on a head, whole or not */
        return R_REFUSE;
    }
    if (err == HPE_OK) {
        /* unfinished: a framed head tells how much of the body is still to come */
        if (!r->headers_done) {
            if (n <= f->max_head) return R_MORE;
            r->why = NO_HEAD;
            return R_REFUSE;
        }
        if (r->chunked) {  /* the front frames a chunked request of up to a head's bound */
            if (n >= f->max_head) return R_STREAM;
            *need = f->max_head;
            return R_MORE;
        }
        *need = n + (size_t)(r->length - r->body_len);
        return R_MORE;
    }
    if (r->stream || (r->odd && err == HPE_PAUSED)) return R_STREAM;
    if ((err != HPE_PAUSED && err != HPE_PAUSED_UPGRADE) || !r->complete || r->pieces) {
        r->why = NO_MALFORMED;
        r->reason = llhttp_get_error_reason(&parser);
        return R_REFUSE;
    }
    size_t whole = llhttp_get_error_pos(&parser) - p;
    /* an upgrade is answered as plain HTTP/1.1, and then nothing more is read */
    *close = !llhttp_should_keep_alive(&parser) || parser.upgrade;
    if (r->chunked) {
        if (whole > f->max_head) return R_STREAM;
        /* whole: once more, its pieces copied together (the body Python is handed) */
        f->chunks.len = 0;
        memset(r, 0, sizeof *r);
        r->f = f; r->copy = 1;
        f->fields.len = 0;
        llhttp_init(&parser, HTTP_REQUEST, &rq_settings);
        parser.data = r;
        err = llhttp_execute(&parser, p, whole);
        if (r->oom) return -1;
        if ((err != HPE_PAUSED && err != HPE_PAUSED_UPGRADE) || !r->complete ||
            f->chunks.len != r->body_len)
            return R_STREAM;
        *used = whole;
        r->body = f->chunks.p;
        return R_REQUEST;
    }
    if (r->body_len != r->length) return R_STREAM;
    *used = whole;
    if (!r->body) r->body = p + whole;
    if (!r->plain || !f->fast_on) return R_REQUEST;
    const char *body = r->body;
    size_t length = r->body_len;
    const char *target = r->url;
    size_t tn = r->url_len;
    if (r->has_json) {
        plan_t *pl = find_plan(f, target, tn, body, r->json, 0);
        if (!pl || length - r->json != pl->payload) return R_REQUEST;
        *plan = pl; *payload = body + r->json; *payload_end = NULL;
        return R_FAST;
    }
    const char *ds, *de;
    if (!f->json_plans || js_scan(body, length, &ds, &de)) return R_REQUEST;
    size_t kn = length - (de - ds);
    if (kn > 8192) return R_REQUEST;
    char key[8192];
    memcpy(key, body, ds - body);
    memcpy(key + (ds - body), de, body + length - de);
    plan_t *pl = find_plan(f, target, tn, key, kn, 1);
    if (!pl) return R_REQUEST;
    *plan = pl; *payload = ds; *payload_end = de;
    return R_FAST;
}

/* A request for Python (EV_REQUEST; flag 1: streamed, its body follows as EV_BODY): its
 * token, whether the connection stays open after it, where its method, target, body and
 * each header's name and value are (offsets into its bytes, which follow), all
 * little-endian: u64 token, then u32 keep_alive (bit 0) and the HTTP version (minor: bits
 * 8-15, major: 16-23),
 * fields, method offset and length, target offset and length, body offset and length,
 * then 4 x u32 per header field, then the request's bytes as received (a streamed
 * request's head only; a chunked body decoded after them). */
static int push_request(Front *f, uint32_t slot, uint64_t token, int keep, const rq_t *r,
                        const char *p, size_t used, int streamed) {
    uint32_t nf = r->count;
    size_t head = 8 + sizeof(uint32_t[8]) + 16 * (size_t)nf;
    size_t extra = r->chunked && !streamed ? r->body_len : 0;
    ev_t *e = malloc(sizeof(ev_t) + head + used + extra);
    if (!e) return -1;
    conn_t *c = &f->conns[slot];
    e->kind = EV_REQUEST; e->slot = slot; e->gen = c->gen; e->flag = streamed;
    e->len = head + used + extra;
    e->next = NULL;
    char *w = e->data;
    size_t body_at = streamed || extra ? used : (size_t)(r->body - p);
    uint32_t hdr[8] = {(uint32_t)keep | (uint32_t)r->minor << 8 | (uint32_t)r->major << 16, nf, (uint32_t)(r->method - p),
                       (uint32_t)r->method_len, (uint32_t)(r->url - p), (uint32_t)r->url_len,
                       (uint32_t)body_at, streamed ? 0 : (uint32_t)r->body_len};
    memcpy(w, &token, 8);
    memcpy(w + 8, hdr, sizeof hdr);
    uint32_t *fw = (uint32_t *)(w + 8 + sizeof hdr);
    const field_t *fields = (const field_t *)f->fields.p;
    for (uint32_t i = 0; i < nf; i++) {
        const field_t *fl = &fields[i];
        fw[4 * i] = (uint32_t)(fl->name - p); fw[4 * i + 1] = (uint32_t)fl->name_len;
        fw[4 * i + 2] = (uint32_t)(fl->value - p); fw[4 * i + 3] = (uint32_t)fl->value_len;
    }
    memcpy(w + head, p, used);
    if (extra) memcpy(w + head + used, r->body, extra);
    if (f->ev_tail) f->ev_tail->next = e; else f->ev_head = e;
    f->ev_tail = e;
    return 0;
}

static int idle(conn_t *c) {
    return c->mode == M_C && c->write_seq == c->next_seq && c->in.len == c->in_off &&
           c->out.len == c->out_off;
}

static uint64_t next_token(conn_t *c, uint32_t slot) {
    return ((uint64_t)slot << 40) | ((uint64_t)(c->gen & GEN_MASK) << 24) |
           (c->next_seq & SEQ_MASK);
}

/* Input refused (EV_REFUSED: u64 token, u32 what, llhttp's reason): Python answers it in
 * `token`'s turn and the connection closes; nothing after it is read. */
static void refuse_at(Front *f, uint32_t slot, uint64_t token, int why, const char *reason) {
    conn_t *c = &f->conns[slot];
    char buf[12 + 256];
    size_t rn = reason ? strlen(reason) : 0;
    if (rn > 256) rn = 256;
    uint32_t w = (uint32_t)why;
    memcpy(buf, &token, 8); memcpy(buf + 8, &w, 4);
    if (rn) memcpy(buf + 12, reason, rn);
    if (push_ev(f, EV_REFUSED, slot, c->gen, 0, buf, 12 + rn)) { close_conn(f, slot); return; }
    c->no_more = 1; c->in.len = c->in_off = 0; c->partial_since = 0; c->need = 0;
    f->n_refusals++;
}

/* -- a streamed request's body ------------------------------------------------------------- */
static int st_count(llhttp_t *p, const char *at, size_t n) {
    stream_t *st = p->data;
    if (st->in_head) return 0;  /* read by `recognise` */
    st->bytes += n;  /* a trailer field: counted toward the limit, never used */
    if (st->bytes > ((Front *)st->f)->max_header_bytes) { st->why = NO_HEADERS; return -1; }
    return 0;
}

static int st_headers(llhttp_t *p) {
    stream_t *st = p->data;
    st->in_head = 0;
    if (p->upgrade) p->flags |= F_SKIPBODY;  /* as httptools reads it: no body */
    return HPE_PAUSED;  /* the head goes to Python; the body waits for its checks */
}

static int st_body(llhttp_t *p, const char *at, size_t n) {
    stream_t *st = p->data;
    Front *f = st->f;
    if (push_ev(f, EV_BODY, st->slot, f->conns[st->slot].gen, 0, at, n)) { st->oom = 1; return -1; }
    st->unacked += n;
    return 0;
}

static int st_complete(llhttp_t *p) {
    stream_t *st = p->data;
    Front *f = st->f;
    if (push_ev(f, EV_BODY, st->slot, f->conns[st->slot].gen, 1, NULL, 0)) { st->oom = 1; return -1; }
    st->done = 1;
    return HPE_PAUSED;
}

static llhttp_settings_t st_settings;

static void rq_settings_init(void) {
    llhttp_settings_init(&rq_settings);
    rq_settings.on_method = rq_method;
    rq_settings.on_url = rq_url;
    rq_settings.on_header_field = rq_field;
    rq_settings.on_header_value = rq_value;
    rq_settings.on_headers_complete = rq_headers;
    rq_settings.on_body = rq_body;
    rq_settings.on_message_complete = rq_complete;
    llhttp_settings_init(&st_settings);
    st_settings.on_header_field = st_count;
    st_settings.on_header_value = st_count;
    st_settings.on_headers_complete = st_headers;
    st_settings.on_body = st_body;
    st_settings.on_message_complete = st_complete;
}

/* The request at `at` (its head framed: f->rq) is streamed: its head goes to Python now, its
 * body as it comes, once Python's checks open the gate. -1: no memory. */
static int begin_stream(Front *f, uint32_t slot, const char *at, size_t avail) {
    conn_t *c = &f->conns[slot];
    stream_t *st = calloc(1, sizeof *st);
    if (!st) return -1;
    llhttp_init(&st->p, HTTP_REQUEST, &st_settings);
    st->p.data = st; st->f = f; st->slot = slot;
    st->in_head = 1;
    st->gate = f->rq.odd;  /* a head the Python server may refuse: its body waits */
    st->bytes = f->rq.head_bytes;  /* its trailer, if `recognise` read it, is counted anew */
    if (llhttp_execute(&st->p, at, avail) != HPE_PAUSED || st->in_head) { free(st); return -1; }
    size_t head = llhttp_get_error_pos(&st->p) - at;
    int keep = llhttp_should_keep_alive(&st->p) && !st->p.upgrade;
    uint64_t token = next_token(c, slot);
    if (push_request(f, slot, token, keep, &f->rq, at, head, 1)) { free(st); return -1; }
    llhttp_resume(&st->p);
    st->token = token;
    c->st = st;
    if (!keep) { c->close_seq_set = 1; c->close_seq = c->next_seq; c->no_more = 1; }
    c->next_seq++;
    c->in_off += head;
    c->partial_since = 0; c->need = 0;
    f->n_streams++;
    return 0;
}

/* Feed what is buffered to the stream, as far as Python may hold it: 1 once the streamed
 * request is whole (the next may be framed), 0 to wait (its gate, the bytes Python holds,
 * no input) or when it was refused. */
static int stream_feed(Front *f, uint32_t slot) {
    conn_t *c = &f->conns[slot];
    stream_t *st = c->st;
    while (c->open && c->st == st) {
        size_t avail = c->in.len - c->in_off;
        if (st->gate || st->stop || st->unacked >= STREAM_AHEAD || !avail) return 0;
        size_t n = STREAM_AHEAD - st->unacked;  /* so Python holds at most STREAM_AHEAD */
        if (n > avail) n = avail;
        const char *at = c->in.p + c->in_off;
        llhttp_errno_t err = llhttp_execute(&st->p, at, n);
        if (st->oom) { close_conn(f, slot); return 0; }
        if (err == HPE_OK) { c->in_off += n; continue; }
        if ((err == HPE_PAUSED || err == HPE_PAUSED_UPGRADE) && st->done) {
            c->in_off += llhttp_get_error_pos(&st->p) - at;
            end_stream(c);
            return 1;
        }
        /* a broken body, or a trailer past the limit: its request is cut there */
        const char *reason = st->why ? NULL : llhttp_get_error_reason(&st->p);
        int why = st->why ? st->why : NO_MALFORMED;
        uint64_t token = st->token;
        end_stream(c);
        refuse_at(f, slot, token, why, reason);
        return 0;
    }
    return 0;
}

static void parse(Front *f, uint32_t slot, double now) {
    conn_t *c = &f->conns[slot];
    while (c->open && c->mode == M_C) {
        if (c->st) {
            if (stream_feed(f, slot)) continue;
            break;
        }
        if (c->no_more) break;
        size_t avail = c->in.len - c->in_off;
        if (!avail) { c->partial_since = 0; break; }
        if (c->next_seq - c->write_seq >= f->max_pipe || c->out.len - c->out_off > f->high_water)
            break;
        size_t used = 0; plan_t *pl = NULL; int cl = 0; const char *payload = NULL, *pend = NULL;
        const char *at = c->in.p + c->in_off;
        size_t need = 0;
        int r = recognise(f, at, avail, &used, &pl, &cl, &payload, &pend, &f->rq, &need);
        if (r < 0) { close_conn(f, slot); return; }  /* no memory */
        c->need = need;
        if (r == R_MORE) {
            if (!f->rq.headers_done) {
                if (!c->eof) { if (!c->partial_since) c->partial_since = now; break; }
                /* a head cut short: dropped, as the Python server drops it */
                c->no_more = 1; c->in.len = c->in_off = 0; c->partial_since = 0; c->need = 0;
                break;
            }
            /* a body still to come: framed whole if it comes soon; streamed if it is slow or
             * cut short (its app learns the client sends no more) */
            if (!c->partial_since) c->partial_since = now;
            if (!c->eof && now - c->partial_since <= f->partial_s) break;
            r = R_STREAM;
        }
        if (r == R_STREAM) {
            if (begin_stream(f, slot, at, avail)) { close_conn(f, slot); return; }
            continue;
        }
        uint64_t token = next_token(c, slot);
        if (r == R_REFUSE) {
            c->next_seq++;
            refuse_at(f, slot, token, f->rq.why, f->rq.reason);
            break;
        }
        if (r == R_FAST) {
            arrival_t a = {token, now, pl->id, pl->payload};
            if (buf_reserve(&f->arena, pl->payload) || buf_reserve(&f->arrivals, sizeof a)) {
                close_conn(f, slot);  /* no memory */
                return;
            }
            if (!pend || !js_read(payload, pend, pl->size, f->arena.p + f->arena.len,
                                  pl->payload / pl->size)) {
                if (!pend) memcpy(f->arena.p + f->arena.len, payload, pl->payload);
                f->arena.len += pl->payload;
                buf_add(&f->arrivals, &a, sizeof a);
                f->n_fast++;
            } else {
                r = R_REQUEST; /* numbers the Python path must word an error for */
            }
        }
        if (r == R_REQUEST) {
            if (push_request(f, slot, token, !cl, &f->rq, at, used, 0)) {
                close_conn(f, slot);  /* no memory */
                return;
            }
            f->n_requests++;
        }
        if (cl) { c->close_seq_set = 1; c->close_seq = c->next_seq; c->no_more = 1; }
        c->next_seq++;
        c->in_off += used;
        c->partial_since = 0;
    }
    if (!c->open) return;
    if (c->in_off && c->in_off == c->in.len) c->in.len = c->in_off = 0;
    /* the client sends no more: the requests Python answers learn it once what it sent is
     * framed, and a streamed body's last bytes handed over (as the Python server's app
     * reads what was sent before it is told); their answers are still written, for a
     * client that only half-closed */
    if (c->eof_owed && (!c->st || c->in.len == c->in_off)) {
        c->eof_owed = 0;
        if (c->next_seq != c->write_seq) push_ev(f, EV_EOF, slot, c->gen, 0, NULL, 0);
    }
    if (f->closing && idle(c)) { close_conn(f, slot); return; }
    if (c->mode == M_C && c->eof && c->write_seq == c->next_seq && c->in.len == c->in_off) {
        if (c->out.len > c->out_off) c->close_after = 1; else { close_conn(f, slot); return; }
    }
    watch(f, slot);
}

static void on_read(Front *f, uint32_t slot, double now, uint32_t e) {
    conn_t *c = &f->conns[slot];
    if (e & EPOLLERR) {
        /* a reset or a socket error: collected whether or not reading is paused (epoll
         * reports it level-triggered either way, and an uncollected one spins this thread) */
        close_conn(f, slot);
        return;
    }
    if ((e & EPOLLHUP) && c->mode == M_C && !(e & EPOLLIN)) {
        close_conn(f, slot); /* both ways shut, nothing left to read: the client is gone */
        return;
    }
    if (c->eof && c->mode != M_LINGER) {
        /* nothing more to read; a hang-up now means the client is gone both ways */
        if (e & (EPOLLHUP | EPOLLERR)) close_conn(f, slot);
        return;
    }
    if (c->mode == M_C) {
        for (int i = 0; i < 4 && c->open && !c->eof; i++) {
            size_t room = in_room(f, c), have = c->in.len - c->in_off;
            if (have >= room) break;
            size_t want = room - have < READ_CHUNK ? room - have : READ_CHUNK;  /* never past it */
            if (c->in_off && c->in.len + READ_CHUNK > c->in.cap) {
                memmove(c->in.p, c->in.p + c->in_off, c->in.len - c->in_off);
                c->in.len -= c->in_off; c->in_off = 0;
            }
            if (buf_reserve(&c->in, READ_CHUNK)) { close_conn(f, slot); return; }
            ssize_t n = recv(c->fd, c->in.p + c->in.len, want, 0);
            if (n == 0) { c->eof = c->eof_owed = 1; break; }
            if (n < 0) {
                if (errno == EINTR) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) break;
                close_conn(f, slot);
                return;
            }
            c->in.len += n; c->last_io = now;
            if ((size_t)n < want) break;
        }
        parse(f, slot, now);
        return;
    }
    /* lingering: what the client still sends is read and dropped until it closes */
    char chunk[READ_CHUNK];
    ssize_t n = recv(c->fd, chunk, sizeof chunk, 0);
    if (n < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) return;
        close_conn(f, slot);
        return;
    }
    c->last_io = now;
    if (n == 0) close_conn(f, slot);
}

/* Turn a connection away at once: the 503, a FIN, what it sent read and dropped (so the
 * close is no reset that destroys the 503 on its way), closed. */
static void refuse_now(Front *f, int fd) {
    if (send(fd, f->busy.p, f->busy.len, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0) shutdown(fd, SHUT_WR);
    char sink[4096];
    for (int i = 0; i < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {}
    close(fd);
    f->n_refused++;
}

/* No descriptor, buffer or memory for a new connection: stop watching the listening socket
 * for ACCEPT_BACKOFF_S (it stays readable, and a level-triggered watch would spin this
 * thread) and take connections again after it, as nginx and libuv do. */
static void pause_accepting(Front *f, double now) {
    if (f->accept_paused || f->lfd < 0) return;
    struct epoll_event ev = {.events = 0, .data.u64 = TAG_LISTEN};
    epoll_ctl(f->ep, EPOLL_CTL_MOD, f->lfd, &ev);
    f->accept_paused = 1; f->accept_resume = now + ACCEPT_BACKOFF_S; f->n_accept_paused++;
}

static void resume_accepting(Front *f, double now) {
    if (!f->accept_paused || now < f->accept_resume) return;
    f->accept_paused = 0;
    if (f->lfd < 0 || !f->accepting) return;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = TAG_LISTEN};
    epoll_ctl(f->ep, EPOLL_CTL_MOD, f->lfd, &ev);
}

/* accept4 failed with `err`: 1 go on accepting, 0 stop for now. At the descriptor limit
 * the spare descriptor is given up for a moment to take the client and refuse it (503),
 * so a client past the limit is answered rather than left waiting in the backlog. */
static int accept_failed(Front *f, int err, double now) {
    if (err == EINTR || err == ECONNABORTED || err == EPROTO) return 1;
    if (err == EAGAIN || err == EWOULDBLOCK) return 0;
    if ((err == EMFILE || err == ENFILE) && f->spare_fd >= 0) {
        close(f->spare_fd);
        int fd = accept4(f->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) refuse_now(f, fd);
        f->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && f->spare_fd >= 0) return 1;
    }
    pause_accepting(f, now);  /* ENOBUFS, ENOMEM, or no spare descriptor to give up */
    return 0;
}

static void do_accept(Front *f, double now) {
    for (int i = 0; i < 64 && f->accepting && !f->accept_paused; i++) {
        int fd = accept4(f->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (accept_failed(f, errno, now)) continue;
            return;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (f->nconn >= f->max_conns) {
            /* the connection idle longest makes room, as the Python server does */
            uint32_t victim = UINT32_MAX; double oldest = 0;
            for (uint32_t s = 0; s < f->nslots; s++) {
                conn_t *c = &f->conns[s];
                if (c->open && c->mode == M_C && c->write_seq == c->next_seq &&
                    c->in.len == c->in_off && (victim == UINT32_MAX || c->last_io < oldest)) {
                    victim = s; oldest = c->last_io;
                }
            }
            if (victim == UINT32_MAX) {
                /* every one has a request under way: 503, then a lingering close (the
                 * client reads the 503, not a reset), in one of the spare slots */
                if (!f->nfree) { refuse_now(f, fd); continue; }
                uint32_t slot = f->freelist[--f->nfree];
                conn_t *c = &f->conns[slot];
                uint32_t gen = c->gen;
                memset(c, 0, sizeof *c);
                c->gen = gen; c->fd = fd; c->open = 1; c->last_io = now;
                c->mode = M_LINGER; c->shut_after = 1; c->linger_until = now + LINGER_S;
                c->events = EPOLLIN;
                struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ((uint64_t)gen << 32) | slot};
                if (buf_add(&c->out, f->busy.p, f->busy.len) ||
                    epoll_ctl(f->ep, EPOLL_CTL_ADD, fd, &ev)) {
                    buf_free(&c->out); close(fd); c->open = 0; c->fd = -1;
                    f->freelist[f->nfree++] = slot;
                    continue;
                }
                f->nconn++;
                flush(f, slot);
                continue;
            }
            close_conn(f, victim);
        }
        if (!f->nfree) { refuse_now(f, fd); continue; }  /* every slot held or reserved */
        uint32_t slot = f->freelist[--f->nfree];
        conn_t *c = &f->conns[slot];
        uint32_t gen = c->gen;
        memset(c, 0, sizeof *c);
        c->gen = gen; c->fd = fd; c->open = 1; c->mode = M_C; c->last_io = now;
        c->events = EPOLLIN;
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ((uint64_t)gen << 32) | slot};
        if (epoll_ctl(f->ep, EPOLL_CTL_ADD, fd, &ev)) {
            close(fd); c->open = 0; f->freelist[f->nfree++] = slot; continue;
        }
        f->nconn++; f->n_accepted++;
    }
}

static int put(Front *f, uint64_t token, const char *d, size_t n, int last, int close);

/* The head arriving on `slot` took too long: the 408 is the answer in its turn (after those
 * of the requests before it), nothing more is read (what was is dropped), then a lingering
 * close. */
static void slow_head(Front *f, uint32_t slot) {
    conn_t *c = &f->conns[slot];
    uint64_t token = next_token(c, slot);
    c->next_seq++;
    c->in.len = c->in_off = 0; c->partial_since = 0; c->no_more = 1;
    put(f, token, f->slow_head.p, f->slow_head.len, 1, 1);
    if (c->open) flush(f, slot);
}

static void sweep(Front *f, double now) {
    for (uint32_t s = 0; s < f->nslots; s++) {
        conn_t *c = &f->conns[s];
        if (!c->open) continue;
        if (c->mode == M_LINGER) {
            if (now > c->linger_until) close_conn(f, s);
        } else if (c->mode == M_C) {
            if (idle(c) && (f->closing || now - c->last_io > f->keep_alive_s)) close_conn(f, s);
            else if (c->partial_since && !c->need && f->slow_head.len) {
                /* a head still arriving: past header_timeout_s it is refused (408) in its
                 * turn, as the Python server refuses it, and the connection ends */
                if (now - c->partial_since > f->header_timeout_s) slow_head(f, s);
            } else if (c->partial_since && !c->st && now - c->partial_since > f->partial_s) {
                parse(f, s, now);  /* a slow body is streamed: the app's timeouts apply */
            }
        }
    }
}

static void *io_main(void *arg) {
    Front *f = arg;
    struct epoll_event evs[256];
    double last_sweep = now_s();
    while (1) {
        int n = epoll_wait(f->ep, evs, 256, 100);
        pthread_mutex_lock(&f->mu);
        if (n == 0) f->n_idle++;
        if (!f->running) { pthread_mutex_unlock(&f->mu); break; }
        double now = now_s();
        for (int i = 0; i < n; i++) {
            uint64_t tag = evs[i].data.u64;
            if (tag == TAG_LISTEN) { do_accept(f, now); continue; }
            if (tag == TAG_WAKE) { uint64_t x; if (read(f->wake_fd, &x, 8) < 0) {} continue; }
            uint32_t slot = (uint32_t)tag, gen = (uint32_t)(tag >> 32);
            if (slot >= f->nslots) continue;
            conn_t *c = &f->conns[slot];
            if (!c->open || c->gen != gen) continue;
            uint32_t e = evs[i].events;
            if (e & EPOLLOUT) flush(f, slot);
            if (c->open && c->gen == gen && (e & (EPOLLIN | EPOLLHUP | EPOLLERR))) on_read(f, slot, now, e);
        }
        if (now - last_sweep > SWEEP_S) { sweep(f, now); last_sweep = now; }
        resume_accepting(f, now);
        f->n_loops++;
        signal_py(f);
        pthread_mutex_unlock(&f->mu);
    }
    return NULL;
}

/* -- Python API --------------------------------------------------------------------------- */
static void place(Front *f, uint64_t token, const char **head, const size_t *hl, int nh,
                  const char **body, const size_t *bl, int nb, int close);
static void after_answers(Front *f, uint32_t slot);

#define LOCK(f) do { if (pthread_mutex_trylock(&(f)->mu)) { Py_BEGIN_ALLOW_THREADS \
    pthread_mutex_lock(&(f)->mu); Py_END_ALLOW_THREADS } } while (0)
#define UNLOCK(f) pthread_mutex_unlock(&(f)->mu)

static int Front_init(Front *f, PyObject *args, PyObject *kw) {
    static char *names[] = {"fd", "max_connections", "max_pipelined", "max_header_count",
                            "max_header_bytes", "max_body_bytes", "max_unsent_bytes",
                            "keep_alive_s", "partial_s", "busy", "header_timeout_s",
                            "slow_head", NULL};
    int fd;
    unsigned int mc, mp, mhc, mhb, mb;
    Py_ssize_t hw;
    double ka, ps, ht = 0;
    Py_buffer busy, slow = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iIIIIInddy*|dy*", names, &fd, &mc, &mp, &mhc,
                                     &mhb, &mb, &hw, &ka, &ps, &busy, &ht, &slow))
        return -1;
    if (f->started) {
        PyBuffer_Release(&busy); if (slow.buf) PyBuffer_Release(&slow);
        PyErr_SetString(PyExc_RuntimeError, "started"); return -1;
    }
    if (slow.buf) { buf_add(&f->slow_head, slow.buf, slow.len); PyBuffer_Release(&slow); }
    f->header_timeout_s = ht;
    pthread_mutex_init(&f->mu, NULL);
    f->max_conns = mc ? mc : 1; f->max_pipe = mp ? mp : 1; f->max_header_count = mhc;
    /* a head's bound: the Python server's (request line and headers, with their line ends) */
    f->max_header_bytes = mhb; f->max_head = 2 * mhb + 4096 + 1024; f->max_body = mb;
    f->high_water = hw; f->keep_alive_s = ka; f->partial_s = ps;
    f->nslots = f->max_conns + 64;
    f->conns = calloc(f->nslots, sizeof(conn_t));
    f->freelist = malloc(f->nslots * sizeof(uint32_t));
    buf_add(&f->busy, busy.buf, busy.len);
    PyBuffer_Release(&busy);
    if (!f->conns || !f->freelist) { PyErr_NoMemory(); return -1; }
    for (uint32_t i = 0; i < f->nslots; i++) f->freelist[i] = f->nslots - 1 - i;
    f->nfree = f->nslots;
    f->lfd = dup(fd);
    f->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    f->ep = epoll_create1(EPOLL_CLOEXEC);
    f->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    f->py_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (f->lfd < 0 || f->ep < 0 || f->wake_fd < 0 || f->py_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError); return -1;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = TAG_LISTEN};
    epoll_ctl(f->ep, EPOLL_CTL_ADD, f->lfd, &ev);
    struct epoll_event we = {.events = EPOLLIN, .data.u64 = TAG_WAKE};
    epoll_ctl(f->ep, EPOLL_CTL_ADD, f->wake_fd, &we);
    f->fast_on = 1; f->accepting = 1; f->running = 1;
    if (pthread_create(&f->thread, NULL, io_main, f)) {
        f->running = 0; PyErr_SetString(PyExc_OSError, "cannot start the front's thread"); return -1;
    }
    f->started = 1;
    return 0;
}

static void stop_thread(Front *f) {
    if (!f->started) return;
    pthread_mutex_lock(&f->mu);
    f->running = 0;
    pthread_mutex_unlock(&f->mu);
    uint64_t one = 1;
    if (write(f->wake_fd, &one, 8) < 0) {}
    pthread_join(f->thread, NULL);
    f->started = 0;
    for (uint32_t s = 0; s < f->nslots; s++) if (f->conns[s].open) close_conn(f, s);
    if (f->lfd >= 0) close(f->lfd);
    close(f->ep); close(f->wake_fd); close(f->py_fd);
    if (f->spare_fd >= 0) close(f->spare_fd);
    f->spare_fd = -1;
    f->lfd = f->ep = f->wake_fd = f->py_fd = -1;
}

static void Front_dealloc(Front *f) {
    stop_thread(f);
    for (ev_t *e = f->ev_head; e;) { ev_t *n = e->next; free(e); e = n; }
    for (int i = 0; i < NPLANS; i++) free(f->plans[i].key);
    buf_free(&f->arena); buf_free(&f->arrivals); buf_free(&f->busy); buf_free(&f->slow_head);
    buf_free(&f->chunks); buf_free(&f->fields);
    free(f->conns); free(f->freelist);
    if (f->started || f->conns) pthread_mutex_destroy(&f->mu);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyObject *Front_stop(Front *f, PyObject *unused) {
    Py_BEGIN_ALLOW_THREADS stop_thread(f); Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *Front_fileno(Front *f, PyObject *unused) { return PyLong_FromLong(f->py_fd); }

/* add_plan(target, key, payload_bytes, plan_id, size=0) -> bool (False: the table is
 * full); size 0: a binary request's (key: its JSON header), 4 / 8: a JSON request's whose
 * data is FP32 / FP64 (key: its body with the data list emptied, `skeleton`). */
static PyObject *Front_add_plan(Front *f, PyObject *args) {
    Py_buffer t, h; unsigned int payload; int id, size = 0;
    if (!PyArg_ParseTuple(args, "y*y*Ii|i", &t, &h, &payload, &id, &size)) return NULL;
    if ((size != 0 && size != 4 && size != 8) || (size && payload % size)) {
        PyBuffer_Release(&t); PyBuffer_Release(&h);
        PyErr_SetString(PyExc_ValueError, "add_plan: size is 0, 4 or 8, dividing payload");
        return NULL;
    }
    int ok = 0;
    LOCK(f);
    if (!find_plan(f, t.buf, t.len, h.buf, h.len, size != 0) && f->nplans < NPLANS / 2) {
        uint64_t hash = fnv(t.buf, t.len, h.buf, h.len);
        char *key = malloc(t.len + 1 + h.len);
        if (key) {
            memcpy(key, t.buf, t.len); key[t.len] = '\0'; memcpy(key + t.len + 1, h.buf, h.len);
            for (uint32_t i = 0; i < NPLANS; i++) {
                plan_t *p = &f->plans[(hash + i) % NPLANS];
                if (!p->key) {
                    p->key = key; p->keylen = t.len + 1 + h.len; p->hash = hash;
                    p->id = id; p->payload = payload; p->size = size; f->nplans++; ok = 1;
                    if (size) f->json_plans = 1;
                    break;
                }
            }
            if (!ok) free(key);
        }
    }
    UNLOCK(f);
    PyBuffer_Release(&t); PyBuffer_Release(&h);
    return PyBool_FromLong(ok);
}

static PyObject *Front_clear_plans(Front *f, PyObject *unused) {
    LOCK(f);
    for (int i = 0; i < NPLANS; i++) { free(f->plans[i].key); f->plans[i].key = NULL; }
    f->nplans = 0; f->json_plans = 0;
    UNLOCK(f);
    Py_RETURN_NONE;
}

/* skeleton(body) -> (key, count) | None: a JSON request's plan key (the body with its one
 * data list emptied) and how many numbers that list holds, as `recognise` reads them. */
static PyObject *Front_skeleton(Front *f, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    const char *body = b.buf, *ds, *de;
    PyObject *out = NULL;
    if (!js_scan(body, b.len, &ds, &de)) {
        uint32_t count = 0;
        js_t j = {ds, de, 0, NULL, NULL, 0};
        int is_int, bad = 0;
        while (1) {
            js_ws(&j);
            if (j.p >= j.end) break;
            if (js_number(&j, &is_int)) { bad = 1; break; }
            count++;
            js_ws(&j);
            if (j.p < j.end && *j.p == ',') j.p++;
        }
        if (!bad) {
            size_t kn = b.len - (de - ds);
            PyObject *key = PyBytes_FromStringAndSize(NULL, kn);
            if (key) {
                char *k = PyBytes_AS_STRING(key);
                memcpy(k, body, ds - body);
                memcpy(k + (ds - body), de, body + b.len - de);
                out = Py_BuildValue("(NI)", key, count);
            }
        }
    }
    PyBuffer_Release(&b);
    if (!out && !PyErr_Occurred()) Py_RETURN_NONE;
    return out;
}

/* answer_json(tokens, head, prefix, rows, ends, suffix): request i gets head, its length
 * and connection lines, and prefix + rows[ends[i-1]:ends[i]] + suffix (ends: int64). */
static PyObject *Front_answer_json(Front *f, PyObject *args) {
    Py_buffer tk, head, pre, rows, ends, suf;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*", &tk, &head, &pre, &rows, &ends, &suf)) return NULL;
    size_t ntok = tk.len / 8;
    const int64_t *e = ends.buf;
    int ok = (size_t)ends.len / 8 == ntok;
    for (size_t i = 0; ok && i < ntok; i++)
        if (e[i] < (i ? e[i - 1] : 0) || e[i] > rows.len) ok = 0;
    if (ok) {
        const uint64_t *tokens = tk.buf;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&f->mu);
        for (size_t t = 0; t < ntok; t++) {
            int64_t s0 = t ? e[t - 1] : 0;
            size_t body = pre.len + (e[t] - s0) + suf.len;
            char line[48];
            int ln = snprintf(line, sizeof line, "content-length: %zu\r\n", body);
            const char *hp[2] = {head.buf, line};
            size_t hl[2] = {head.len, (size_t)ln};
            const char *bp[3] = {pre.buf, (char *)rows.buf + s0, suf.buf};
            size_t bl[3] = {pre.len, (size_t)(e[t] - s0), suf.len};
            place(f, tokens[t], hp, hl, 2, bp, bl, 3, 0);
        }
        for (size_t t = 0; t < ntok; t++) if ((tokens[t] >> 40) < f->nslots) after_answers(f, tokens[t] >> 40);
        signal_py(f);
        pthread_mutex_unlock(&f->mu);
        Py_END_ALLOW_THREADS
    } else {
        PyErr_SetString(PyExc_ValueError, "answer_json: one end per request, increasing");
    }
    PyBuffer_Release(&tk); PyBuffer_Release(&head); PyBuffer_Release(&pre);
    PyBuffer_Release(&rows); PyBuffer_Release(&ends); PyBuffer_Release(&suf);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* take() -> (events, arrivals, payloads): events a list of (kind, cid, flag, bytes); arrivals
 * the packed records (token u64, time f64, plan i32, length u32); payloads their bytes. */
static PyObject *Front_take(Front *f, PyObject *unused) {
    uint64_t x;
    if (read(f->py_fd, &x, 8) < 0) {}
    LOCK(f);
    ev_t *evs = f->ev_head;
    f->ev_head = f->ev_tail = NULL;
    buf_t arr = f->arrivals, arena = f->arena;
    memset(&f->arrivals, 0, sizeof(buf_t)); memset(&f->arena, 0, sizeof(buf_t));
    f->signaled = 0;
    UNLOCK(f);
    PyObject *list = PyList_New(0);
    for (ev_t *e = evs; e;) {
        ev_t *next = e->next;
        if (list) {
            PyObject *t = Py_BuildValue("(iKiy#)", e->kind, ((unsigned long long)e->gen << 32) | e->slot,
                                        e->flag, e->data, (Py_ssize_t)e->len);
            if (!t || PyList_Append(list, t)) Py_CLEAR(list);
            Py_XDECREF(t);
        }
        free(e);
        e = next;
    }
    PyObject *out = NULL;
    if (list) out = Py_BuildValue("(Ny#y#)", list, arr.p ? arr.p : "", (Py_ssize_t)arr.len,
                                  arena.p ? arena.p : "", (Py_ssize_t)arena.len);
    buf_free(&arr); buf_free(&arena);
    return out;
}

/* The answer to `seq` closes the connection: nothing after it is read or written (an
 * earlier answer than one that closes already, a request's `Connection: close` included). */
static void closes_at(conn_t *c, uint32_t seq) {
    if (c->st) c->st->stop = 1;  /* the streamed request is the last: its body is not read on */
    if (c->close_seq_set &&
        ((c->close_seq - c->write_seq) & SEQ_MASK) <= ((seq - c->write_seq) & SEQ_MASK))
        return;
    c->close_seq_set = 1; c->close_seq = seq; c->no_more = 1;
}

/* The held answer of `seq` on `c`, made (in order) if there is none yet. */
static held_t *held_for(conn_t *c, uint32_t seq) {
    held_t **pp = &c->held;
    uint32_t d = (seq - c->write_seq) & SEQ_MASK;
    while (*pp && (((*pp)->seq - c->write_seq) & SEQ_MASK) < d) pp = &(*pp)->next;
    if (*pp && (*pp)->seq == seq) return *pp;
    held_t *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->seq = seq; h->next = *pp; *pp = h;
    return h;
}

/* The answer whose turn it was is whole: the next request's turn. What was held for the
 * turns that follow goes out, up to one not whole yet (its later bytes are written as they
 * come); an answer that closes the connection ends it (lingering). */
static void answered(Front *f, uint32_t slot) {
    conn_t *c = &f->conns[slot];
    for (;;) {
        int closes = c->close_seq_set && (c->close_seq & SEQ_MASK) == (c->write_seq & SEQ_MASK);
        c->write_seq++;
        if (closes) { linger_close(f, slot); return; }
        held_t *h = c->held;
        if (!h || h->seq != (c->write_seq & SEQ_MASK)) return;
        c->held = h->next;
        c->held_bytes -= h->data.len;
        int done = h->done, bad = buf_add(&c->out, h->data.p, h->data.len);
        buf_free(&h->data); free(h);
        if (bad) { close_conn(f, slot); return; }
        if (!done) return;
    }
}

/* An answer for the request `token`: into its connection's output in order. It is the
 * `head` parts (status line and headers), the connection line and blank line, then the
 * `body` parts. */
/* The open connection bytes of the answer to `token` go to, or NULL where they go nowhere:
 * a token not outstanding on its slot; a client gone (dropped; the end of its last owed
 * answer frees the slot); a connection lingering after one that closed it (counted gone).
 * `last`: these bytes end the answer. */
static conn_t *answer_to(Front *f, uint64_t token, int last) {
    uint32_t slot = token >> 40, gen = (token >> 24) & 0xffff, seq = token & SEQ_MASK;
    if (slot >= f->nslots) return NULL;
    conn_t *c = &f->conns[slot];
    if ((c->gen & GEN_MASK) != gen) return NULL;
    if (((seq - c->write_seq) & SEQ_MASK) >= ((c->next_seq - c->write_seq) & SEQ_MASK))
        return NULL;
    if (!c->open) {
        if (last && c->reserved && !--c->owed) free_slot(f, slot);
        return NULL;
    }
    if (c->mode == M_LINGER) { c->gone += last; return NULL; }
    return c;
}

static void place(Front *f, uint64_t token, const char **head, const size_t *hl, int nh,
                  const char **body, const size_t *bl, int nb, int close) {
    uint32_t slot = token >> 40, seq = token & SEQ_MASK;
    conn_t *c = answer_to(f, token, 1);
    if (!c) return;
    if (close) closes_at(c, seq);
    int last = c->close_seq_set && (c->close_seq & SEQ_MASK) == seq;
    const char *tail = last ? "connection: close\r\n\r\n" : "\r\n";
    size_t tn = strlen(tail), total = tn;
    for (int i = 0; i < nh; i++) total += hl[i];
    for (int i = 0; i < nb; i++) total += bl[i];
    held_t *h = NULL;
    buf_t *dst = &c->out;
    if ((c->write_seq & SEQ_MASK) != seq) {
        h = held_for(c, seq);
        if (!h) { close_conn(f, slot); return; }
        dst = &h->data;
    }
    if (buf_reserve(dst, total)) { close_conn(f, slot); return; }
    char *w = dst->p + dst->len;
    for (int i = 0; i < nh; i++) { memcpy(w, head[i], hl[i]); w += hl[i]; }
    memcpy(w, tail, tn); w += tn;
    for (int i = 0; i < nb; i++) { memcpy(w, body[i], bl[i]); w += bl[i]; }
    dst->len += total;
    if (h) { h->done = 1; c->held_bytes += total; return; }
    answered(f, slot);
}

/* Bytes of the answer to `token`, a request Python answers itself (a request event), in
 * its connection's order: written now if it is that request's turn, else held. `last`: the
 * answer is whole; `close`: the connection closes after it. 1 while what waits to be sent
 * on the connection is past the mark: the writer waits for DRAINED. */
static int put(Front *f, uint64_t token, const char *d, size_t n, int last, int close) {
    uint32_t slot = token >> 40, seq = token & SEQ_MASK;
    conn_t *c = answer_to(f, token, last);
    if (!c) return 0;
    if (close) closes_at(c, seq);
    if ((c->write_seq & SEQ_MASK) == seq) {
        if (buf_add(&c->out, d, n)) { close_conn(f, slot); return 0; }
        if (last) answered(f, slot);
    } else {
        held_t *h = held_for(c, seq);
        if (!h || buf_add(&h->data, d, n)) { close_conn(f, slot); return 0; }
        c->held_bytes += n;
        h->done = last;
    }
    if (c->out.len - c->out_off + c->held_bytes > f->high_water) { c->over_high = 1; return 1; }
    return 0;
}

static void after_answers(Front *f, uint32_t slot) {
    conn_t *c = &f->conns[slot];
    if (!c->open) return;
    flush(f, slot);
    if (c->open && c->mode == M_C) parse(f, slot, now_s());
}

/* answer_parts(tokens, head, body_prefix, [(buffer, bytes_per_request), ...]): request i
 * gets head + its connection line + body_prefix + each buffer's i-th slice. */
static PyObject *Front_answer_parts(Front *f, PyObject *args) {
    Py_buffer tk, head, pre; PyObject *outs;
    if (!PyArg_ParseTuple(args, "y*y*y*O!", &tk, &head, &pre, &PyList_Type, &outs)) return NULL;
    int n = (int)PyList_GET_SIZE(outs);
    Py_buffer bufs[8]; Py_ssize_t per[8]; int got = 0, ok = n <= 8;
    for (int i = 0; ok && i < n; i++) {
        PyObject *item = PyList_GET_ITEM(outs, i);
        PyObject *o; Py_ssize_t k;
        if (!PyArg_ParseTuple(item, "On", &o, &k) || PyObject_GetBuffer(o, &bufs[i], PyBUF_C_CONTIGUOUS)) { ok = 0; break; }
        got++; per[i] = k;
    }
    size_t ntok = tk.len / 8;
    for (int i = 0; ok && i < n; i++) if ((size_t)bufs[i].len < ntok * per[i]) ok = 0;
    if (ok) {
        const uint64_t *tokens = tk.buf;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&f->mu);
        const char *hp[1] = {head.buf}, *parts[9]; size_t hl[1] = {head.len}, lens[9];
        parts[0] = pre.buf; lens[0] = pre.len;
        for (size_t t = 0; t < ntok; t++) {
            for (int i = 0; i < n; i++) { parts[i + 1] = (char *)bufs[i].buf + t * per[i]; lens[i + 1] = per[i]; }
            place(f, tokens[t], hp, hl, 1, parts, lens, n + 1, 0);
        }
        for (size_t t = 0; t < ntok; t++) {
            uint32_t slot = tokens[t] >> 40;
            if (slot < f->nslots) after_answers(f, slot);
        }
        signal_py(f);
        pthread_mutex_unlock(&f->mu);
        Py_END_ALLOW_THREADS
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "answer_parts: at most 8 parts, each covering every request");
    }
    for (int i = 0; i < got; i++) PyBuffer_Release(&bufs[i]);
    PyBuffer_Release(&tk); PyBuffer_Release(&head); PyBuffer_Release(&pre);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* answer_same(tokens, head, body, close=False): the same answer (an error) to each of
 * `tokens`; `close`: each connection closes after it. */
static PyObject *Front_answer_same(Front *f, PyObject *args) {
    Py_buffer tk, head, body;
    int close = 0;
    if (!PyArg_ParseTuple(args, "y*y*y*|p", &tk, &head, &body, &close)) return NULL;
    const uint64_t *tokens = tk.buf;
    size_t ntok = tk.len / 8;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&f->mu);
    const char *hp[1] = {head.buf}, *bp[1] = {body.buf};
    size_t hl[1] = {head.len}, bl[1] = {body.len};
    for (size_t t = 0; t < ntok; t++) place(f, tokens[t], hp, hl, 1, bp, bl, 1, close);
    for (size_t t = 0; t < ntok; t++) if ((tokens[t] >> 40) < f->nslots) after_answers(f, tokens[t] >> 40);
    signal_py(f);
    pthread_mutex_unlock(&f->mu);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&tk); PyBuffer_Release(&head); PyBuffer_Release(&body);
    Py_RETURN_NONE;
}

/* write(token, data, last=False, close=False) -> bool: bytes of the answer to a request
 * event (`put`); True: wait for DRAINED before writing more. */
static PyObject *Front_write(Front *f, PyObject *args) {
    unsigned long long token; Py_buffer d; int last = 0, close = 0;
    if (!PyArg_ParseTuple(args, "Ky*|pp", &token, &d, &last, &close)) return NULL;
    int high = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&f->mu);
    uint32_t slot = (uint32_t)(token >> 40);
    high = put(f, token, d.buf, d.len, last, close);
    if (slot < f->nslots) {
        after_answers(f, slot);
        high = high && f->conns[slot].open;
    }
    signal_py(f);
    pthread_mutex_unlock(&f->mu);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&d);
    return PyBool_FromLong(high);
}

/* more(token, taken): the streamed request `token` may go on: Python's checks passed its
 * head (the gate opens) and its app took `taken` more bytes of its body. */
static PyObject *Front_more(Front *f, PyObject *args) {
    unsigned long long token; Py_ssize_t taken;
    if (!PyArg_ParseTuple(args, "Kn", &token, &taken)) return NULL;
    LOCK(f);
    uint32_t slot = (uint32_t)(token >> 40);
    conn_t *c = slot < f->nslots ? &f->conns[slot] : NULL;
    if (c && c->open && c->st && c->st->token == token) {
        stream_t *st = c->st;
        st->gate = 0;
        size_t t = taken > 0 ? (size_t)taken : 0;
        st->unacked = t < st->unacked ? st->unacked - t : 0;
        parse(f, slot, now_s());
        signal_py(f);
    }
    UNLOCK(f);
    Py_RETURN_NONE;
}

/* abort(cid): close the connection now (Python failed on one of its events) */
static PyObject *Front_abort(Front *f, PyObject *args) {
    unsigned long long cid;
    if (!PyArg_ParseTuple(args, "K", &cid)) return NULL;
    LOCK(f);
    uint32_t slot = (uint32_t)cid;
    if (slot < f->nslots && f->conns[slot].open && f->conns[slot].gen == (uint32_t)(cid >> 32)) {
        close_conn(f, slot);
        signal_py(f);
    }
    UNLOCK(f);
    Py_RETURN_NONE;
}

/* fast(on): off (draining), every request goes to Python; accept(on): take connections */
static PyObject *Front_set(Front *f, PyObject *args) {
    int fast, acc;
    if (!PyArg_ParseTuple(args, "pp", &fast, &acc)) return NULL;
    LOCK(f);
    f->fast_on = fast;
    if (!acc && f->accepting) {  /* the port's other listeners (SO_REUSEPORT) take them */
        epoll_ctl(f->ep, EPOLL_CTL_DEL, f->lfd, NULL);
        close(f->lfd);
        f->lfd = -1;
        f->accepting = 0;
        f->closing = 1;  /* stopping: idle connections close, busy ones once answered */
        for (uint32_t s = 0; s < f->nslots; s++)
            if (f->conns[s].open && idle(&f->conns[s])) close_conn(f, s);
    }
    UNLOCK(f);
    Py_RETURN_NONE;
}

static PyObject *address(struct sockaddr_storage *a) {
    char host[INET6_ADDRSTRLEN] = "";
    int port = 0;
    if (a->ss_family == AF_INET) {
        struct sockaddr_in *v4 = (struct sockaddr_in *)a;
        inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
        port = ntohs(v4->sin_port);
    } else if (a->ss_family == AF_INET6) {
        struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)a;
        inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
        port = ntohs(v6->sin6_port);
    } else {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(si)", host, port);
}

/* addresses(cid) -> (peer, local) | None: an open connection's (host, port) pairs */
static PyObject *Front_addresses(Front *f, PyObject *args) {
    unsigned long long cid;
    if (!PyArg_ParseTuple(args, "K", &cid)) return NULL;
    struct sockaddr_storage peer, local;
    socklen_t pn = sizeof peer, ln = sizeof local;
    int ok = 0;
    LOCK(f);
    uint32_t slot = (uint32_t)cid;
    conn_t *c = slot < f->nslots ? &f->conns[slot] : NULL;
    if (c && c->open && c->gen == (uint32_t)(cid >> 32)) ok = !getpeername(c->fd, (struct sockaddr *)&peer, &pn) &&
                !getsockname(c->fd, (struct sockaddr *)&local, &ln);
    UNLOCK(f);
    if (!ok) Py_RETURN_NONE;
    PyObject *a = address(&peer), *b = address(&local);
    if (!a || !b) { Py_XDECREF(a); Py_XDECREF(b); return NULL; }
    return Py_BuildValue("(NN)", a, b);
}

static PyObject *Front_stats(Front *f, PyObject *unused) {
    LOCK(f);
    unsigned long long in = 0, out = 0, queued = 0, streaming = 0, reserved = 0;
    for (uint32_t s = 0; s < f->nslots; s++) {
        conn_t *c = &f->conns[s];
        reserved += c->reserved;
        if (!c->open) continue;
        in += c->in.len - c->in_off;
        out += c->out.len - c->out_off;
        out += c->held_bytes;
        queued += c->next_seq - c->write_seq;
        streaming += c->st != NULL;
    }
    PyObject *d = Py_BuildValue(
        "{sKsKsKsKsKsIsIsKsKsKsKsKsKsKsKsK}", "fast", (unsigned long long)f->n_fast,
        "requests", (unsigned long long)f->n_requests,
        /* requests streamed (their body as it came), requests refused; connections
         * streaming a request now */
        "streamed", (unsigned long long)f->n_streams,
        "refusals", (unsigned long long)f->n_refusals, "accepted", (unsigned long long)f->n_accepted,
        "connections", f->nconn, "plans", f->nplans, "unparsed_bytes", in, "unsent_bytes", out,
        "queued", queued, "streaming", streaming,
        /* slots held for answers to closed connections; connections turned away at once
         * (503); turns of the front's loop, and those its 100 ms wait ended with nothing
         * to do (a thread at rest has about as many of one as of the other); pauses of
         * accepting (no descriptor or buffer) */
        "reserved", reserved, "refused", (unsigned long long)f->n_refused,
        "loops", (unsigned long long)f->n_loops, "idle_loops", (unsigned long long)f->n_idle,
        "accept_paused", (unsigned long long)f->n_accept_paused);
    UNLOCK(f);
    return d;
}

static PyMethodDef Front_methods[] = {
    {"fileno", (PyCFunction)Front_fileno, METH_NOARGS, "the eventfd that says: take()"},
    {"take", (PyCFunction)Front_take, METH_NOARGS, "events and queued requests"},
    {"add_plan", (PyCFunction)Front_add_plan, METH_VARARGS, "a request the front may queue"},
    {"clear_plans", (PyCFunction)Front_clear_plans, METH_NOARGS, "forget every plan"},
    {"answer_parts", (PyCFunction)Front_answer_parts, METH_VARARGS, "answers of a block"},
    {"answer_same", (PyCFunction)Front_answer_same, METH_VARARGS, "one answer to many"},
    {"answer_json", (PyCFunction)Front_answer_json, METH_VARARGS, "JSON answers of a block"},
    {"skeleton", (PyCFunction)Front_skeleton, METH_VARARGS, "a JSON request's plan key"},
    {"write", (PyCFunction)Front_write, METH_VARARGS, "a request event's answer"},
    {"more", (PyCFunction)Front_more, METH_VARARGS, "a streamed request may go on"},
    {"abort", (PyCFunction)Front_abort, METH_VARARGS, "close a connection now"},
    {"set", (PyCFunction)Front_set, METH_VARARGS, "fast lane and accepting on or off"},
    {"stats", (PyCFunction)Front_stats, METH_NOARGS, "counters"},
    {"addresses", (PyCFunction)Front_addresses, METH_VARARGS, "peer and local address"},
    {"stop", (PyCFunction)Front_stop, METH_NOARGS, "close everything, end the thread"},
    {NULL}};

static PyTypeObject FrontType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "deployments.http.native._front.Front",
    .tp_basicsize = sizeof(Front),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Front_init,
    .tp_dealloc = (destructor)Front_dealloc,
    .tp_methods = Front_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_front", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__front(void) {
    if (PyType_Ready(&FrontType) < 0) return NULL;
    rq_settings_init();
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&FrontType);
    PyModule_AddObject(m, "Front", (PyObject *)&FrontType);
    PyModule_AddIntConstant(m, "EOF", EV_EOF);
    PyModule_AddIntConstant(m, "BODY", EV_BODY);
    PyModule_AddIntConstant(m, "REFUSED", EV_REFUSED);
    PyModule_AddIntConstant(m, "HEAD_TOO_LONG", NO_HEAD);
    PyModule_AddIntConstant(m, "URL_TOO_LONG", NO_URL);
    PyModule_AddIntConstant(m, "HEADERS_TOO_LONG", NO_HEADERS);
    PyModule_AddIntConstant(m, "MALFORMED", NO_MALFORMED);
    PyModule_AddIntConstant(m, "DRAINED", EV_DRAINED);
    PyModule_AddIntConstant(m, "GONE", EV_GONE);
    PyModule_AddIntConstant(m, "REQUEST", EV_REQUEST);
    return m;
}
