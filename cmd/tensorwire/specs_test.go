package main

import (
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/loader"
	"github.com/tensorwire/tensorwire/replay"
)

// TestGrammar_Read: the one reader of NAME[,KEY=VALUE...] values, as each
// flag uses it: settings apply in the order their keys are listed, not
// the order given; errors name the flag's noun, the name, and the key.
func TestGrammar_Read(t *testing.T) {
	for _, tc := range []struct {
		flag, value string
		want        string // "": accepted; else in the error
	}{
		{"buffer", "b,alpha=0.7,sampler=prioritized", ""},
		{"buffer", "b,lease=1s,capacity=8,min-size=2", ""},
		{"buffer", "b,capacity=8,alpha=0.7", ""}, // the buffer may exist, prioritized
		{"buffer", "b,alpha=-1", "buffer b: alpha=-1"},
		{"buffer", "b,capacity=8,,lease=1s", `buffer b: unknown setting ""`},
		{"loader", "l,pad=2,transform=augment,dataset=d,batch=4", ""},
		{"loader", "l,flip,sequential,transform=augment,dataset=d,batch=4", ""},
		{"loader", "l,dataset=d,batch", `loader l: "batch" is not key=value`},
		{"loader", "l,dataset=d,batch=4,sequential=1", "loader l: sequential=1: takes no value"},
		{"store", "s,lease=1s,sync=none", ""},
		{"store", "s,max-value=x", "store s: max-value=x: want a size"},
		{"store", "s,history=1,history=1", "store s: history given twice"},
		{"serve", "m,lease=1s,params=p", ""},
		{"serve", "m,store=s,param=p,max-delay=1ms", ""},
		{"serve", "m,params=p,param=", "model m: param: the name of a parameter set"},
	} {
		var err error
		switch tc.flag {
		case "buffer":
			err = new(bufferFlags).Set(tc.value)
		case "loader":
			err = new(loaderFlags).Set(tc.value)
		case "store":
			err = new(storeFlags).Set(tc.value)
		case "serve":
			err = new(serveFlags).Set(tc.value)
		}
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("--%s %s: %v", tc.flag, tc.value, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("--%s %s: %v; want an error saying %q", tc.flag, tc.value, err, tc.want)
		}
	}
	var b bufferFlags
	if err := b.Set("b,alpha=0.7,capacity=8,sampler=prioritized"); err != nil {
		t.Fatal(err)
	}
	cfg, err := b[0].createConfig()
	if want := replay.Prioritized(0.7, 0.4); err != nil || cfg.Sampler != want || cfg.Capacity != 8 {
		t.Errorf("createConfig: %+v, %v; want capacity 8, sampler %v", cfg, err, want)
	}
	var l loaderFlags
	if err := l.Set("l,std=0.5,flip,transform=augment,dataset=d,batch=4"); err != nil {
		t.Fatal(err)
	}
	if a, ok := l[0].cfg.Transform.(*loader.Augment); !ok || !a.Flip || a.Std != 0.5 || l[0].cfg.Batch != 4 {
		t.Errorf("--loader with augment settings before transform=augment: %+v, transform %+v", l[0].cfg, l[0].cfg.Transform)
	}
}
