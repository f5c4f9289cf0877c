package harness

import (
	"strings"
	"testing"

	"github.com/spillway-gpu/spillway/pool"
)

func TestParseReports(t *testing.T) {
	s := pool.Stats{LiveBytes: 1, PeakLiveBytes: 2, ReservedBytes: 3, PeakReservedBytes: 4, Quota: 5,
		CachedBytes: 6, LargestFreeBlock: 7, CacheHits: 8, DeviceReservations: 9, PassThrough: 10, Syncs: 11,
		ExternalSyncs: 12, SegmentsReleased: 13, Refused: 14, SpilledBytes: 15, SpilledTotal: 16,
		PromotedBytes: 17, PromotedTotal: 18, BackingErrors: 19, ReleaseErrors: 20, CaptureSkips: 21}
	line := s.String() + " deferred_release_errors=22"
	stderr := "spillway: refused requested=1 used=2 quota=3 device=0\n" +
		"spillway: device 1: " + line + "\n" +
		"spillway: device 0: live=0 " + strings.TrimPrefix(line, "live=1 ") + "\n"
	reports, err := ParseReports(stderr)
	if err != nil {
		t.Fatal(err)
	}
	want := Report{Device: 1, Live: 1, PeakLive: 2, Reserved: 3, PeakReserved: 4, Quota: 5, Cached: 6,
		LargestFree: 7, CacheHits: 8, DeviceReservations: 9, PassThrough: 10, Syncs: 11, ExternalSyncs: 12,
		SegmentsReleased: 13, Refused: 14, Spilled: 15, SpilledTotal: 16, Promoted: 17, PromotedTotal: 18,
		BackingErrors: 19, ReleaseErrors: 20, CaptureSkips: 21, DeferredReleaseErrors: 22}
	if len(reports) != 2 || reports[1] != want || reports[0].Live != 0 || reports[0].PromotedTotal != 18 {
		t.Errorf("parsed %+v\nwant device 1 = %+v", reports, want)
	}
	if n := len(NonReportLines(stderr)); n != 1 {
		t.Errorf("%d lines other than reports, want 1", n)
	}

	for name, bad := range map[string]string{
		"missing field":  "spillway: device 0: live=1\n",
		"unknown field":  "spillway: device 0: " + s.String() + " bogus=1\n",
		"not a number":   "spillway: device 0: " + strings.Replace(s.String(), "live=1", "live=x", 1) + "\n",
		"two lines":      "spillway: device 0: " + s.String() + "\nspillway: device 0: " + s.String() + "\n",
		"repeated field": "spillway: device 0: live=1 " + s.String() + "\n",
	} {
		if _, err := ParseReports(bad); err == nil {
			t.Errorf("%s: %q parsed without error", name, bad)
		}
	}
}
