package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tensorwire/tensorwire/internal/service"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/serve"
	"github.com/tensorwire/tensorwire/tensordict"
)

// A --serve model with replicas=0 runs no model in the node: its replicas
// attach from other processes (serve.replica, docs/serve.md "Replicas in
// other processes"), and its row schemas are given as input= and output=
// (or taken from params=P, the MLP's). A schema is FIELD[+FIELD...], a
// field KEY:DTYPE:SHAPE: KEY with "/" between the parts of a nested key,
// DTYPE a torch name without "torch." (float32, int64, uint8, bool...),
// SHAPE one row's dimensions joined by "x" (4x84x84), empty for a scalar:
// input=obs:float32:64, output=logits:float32:16+value:float32:.

// schemaKeys are the settings of a --serve value that give the row
// schemas of a model whose replicas are attached.
var schemaKeys = service.Keys[serveSpec]{
	{Setting: service.Setting{Key: "input", Value: "F", Help: "with replicas=0: the input row's fields, KEY:DTYPE:SHAPE joined by + (obs:float32:64)"},
		Set: func(s *serveSpec, v string) error { return setSchema(&s.input, v) }},
	{Setting: service.Setting{Key: "output", Value: "F", Help: "with replicas=0: the output row's fields (logits:float32:16)"},
		Set: func(s *serveSpec, v string) error { return setSchema(&s.output, v) }},
}

// setSchema parses a schema's text form into *dst.
func setSchema(dst *tensordict.RowSchema, v string) error {
	s, err := parseRowSchema(v)
	if err != nil {
		return err
	}
	*dst = s
	return nil
}

// parseRowSchema parses FIELD[+FIELD...], FIELD KEY:DTYPE:SHAPE.
func parseRowSchema(v string) (tensordict.RowSchema, error) {
	var s tensordict.RowSchema
	for _, f := range strings.Split(v, "+") {
		parts := strings.Split(f, ":")
		if len(parts) != 3 || parts[0] == "" {
			return nil, fmt.Errorf("field %q: want KEY:DTYPE:SHAPE (obs:float32:64)", f)
		}
		dt, err := memmap.ParseDType(parts[1])
		if err != nil {
			return nil, fmt.Errorf("field %q: dtype %q: %v", f, parts[1], err)
		}
		shape := []int{}
		if parts[2] != "" {
			for _, d := range strings.Split(parts[2], "x") {
				n, err := strconv.Atoi(d)
				if err != nil || n < 1 {
					return nil, fmt.Errorf("field %q: shape %q: want dimensions of at least 1 joined by x (4x84x84)", f, parts[2])
				}
				shape = append(shape, n)
			}
		}
		s = append(s, tensordict.RowField{Key: strings.Split(parts[0], "/"), DType: dt, Shape: shape})
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return s, nil
}

// checkAttached checks what a --serve value's settings say about attached
// replicas: input= and output= go together, with replicas=0 and no other
// source of parameters.
func (s *serveSpec) checkAttached() error {
	schema := s.input != nil || s.output != nil
	switch {
	case schema && (s.input == nil || s.output == nil):
		return errors.New("input=F and output=F go together")
	case schema && !s.cfg.AttachedOnly:
		return errors.New("input= and output= are for a model whose replicas attach from other processes: replicas=0")
	case schema && (s.params != "" || s.store != ""):
		return errors.New("input= and output=, or params=P or store=S,param=N, not both")
	case s.cfg.AttachedOnly && s.store != "":
		return errors.New("replicas=0 with store=: the attached replicas follow the store themselves; give input= and output=")
	}
	return nil
}

// startAttached starts the manager of a model whose replicas all attach
// (replicas=0), of the schemas s gives.
func (s serveSpec) startAttached(input, output tensordict.RowSchema, log interface {
	Info(string, ...any)
}) (*serve.Manager, error) {
	cfg := s.cfg
	cfg.Input, cfg.Output = input, output
	m, err := serve.New(cfg)
	if err != nil {
		return nil, err
	}
	log.Info("model served by attached replicas", "name", s.name, "input", input.String(), "output", output.String(),
		"max_batch", s.cfg.MaxBatch, "policy", s.cfg.Policy)
	return m, nil
}
