package transport

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-io/sluice/internal/wfmeta"
)

// ask sends req, a request for bytes of p held by host, on the connection life and
// waits for its answer for at most the attempt's timeout. An answer that has not come
// within lossLookAfter sends it to the controller's record: if p is recorded lost with
// host, it gives up the request and returns the record, before the attempt times out.
func (f *fetcher) ask(life context.Context, req *nats.Msg, p, host string) (*nats.Msg, *wfmeta.LostFile, error) {
	ctx, cancel := context.WithTimeout(life, min(f.attempt, f.timeout))
	defer cancel()
	type answer struct {
		msg *nats.Msg
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		m, err := f.conn.RequestMsgWithContext(ctx, req)
		answered <- answer{m, err}
	}()
	look := time.NewTimer(lossLookAfter)
	defer look.Stop()
	select {
	case a := <-answered:
		return a.msg, nil, a.err
	case <-look.C:
	}
	if l, ok := f.lostWith(p, host); ok {
		cancel()
		<-answered
		return nil, &l, nil
	}
	a := <-answered
	return a.msg, nil, a.err
}

// lostWith returns the controller's record that p's bytes went with host, which it took
// for lost (wfmeta.LostKey), if there is one.
func (f *fetcher) lostWith(p, host string) (wfmeta.LostFile, bool) {
	if f.kv == nil {
		return wfmeta.LostFile{}, false
	}
	ctx, cancel := context.WithTimeout(f.ctx, attemptTimeout)
	defer cancel()
	e, err := f.kv.Get(ctx, wfmeta.LostKey(p))
	if err != nil {
		return wfmeta.LostFile{}, false // none (ErrKeyNotFound), or not known now: the fetch goes on
	}
	var l wfmeta.LostFile
	if json.Unmarshal(e.Value(), &l) != nil || l.Node != host {
		return wfmeta.LostFile{}, false
	}
	return l, true
}
