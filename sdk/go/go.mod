module triplane

go 1.21
