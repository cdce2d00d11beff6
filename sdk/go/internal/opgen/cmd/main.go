// Command opgen writes ops_gen.go from proto/ops.json: go run ./internal/opgen/cmd OPS.json OUT.go
package main

import (
	"fmt"
	"os"

	"triplane/internal/opgen"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: opgen OPS.json OUT.go")
		os.Exit(2)
	}
	src, err := os.ReadFile(os.Args[1])
	if err == nil {
		var out []byte
		if out, err = opgen.Generate(src); err == nil {
			err = os.WriteFile(os.Args[2], out, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "opgen:", err)
		os.Exit(1)
	}
}
